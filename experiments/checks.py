"""The checked argument types the shipped experiments share (`ctl.check_arguments`).

A gin binding of an impossible value (`DigitsTask.hidden_units=0`, a negative
seed) ends the run in one line naming the binding, before anything is written.
"""

from typing import Annotated, Callable, Union

import ctl

AtLeastOne = Annotated[int, ctl.Range(at_least=1)]  # Sizes and counts.
Seed = Annotated[int, ctl.Range(at_least=0)]  # NumPy's generators take no negative seed.
# A positive number, or a schedule (a callable of the step, e.g. @ctl.with_warmup()).
LearningRate = Annotated[Union[float, Callable], ctl.Range(above=0)]
# Token sequences: [CLS] and at least one token, from a vocabulary whose ids 0 and 1 are
# reserved (padding, [CLS]).
SeqLength = Annotated[int, ctl.Range(at_least=2)]
VocabSize = Annotated[int, ctl.Range(at_least=3)]
