"""The sweep's progress on the console: one line after each trial that ends.

    sweep | worker 0 | 7/12 ended (4 complete, 2 pruned, 1 failed), 2 running | best accuracy = 0.9611 (trial 3)

Once every worker ended, the command prints it once more (`sweep | done: ...`)
with where to look; a sweep in which no trial ended but failed ends instead
with one line on stderr naming the first failed trial's own line, and exits
`EXIT_ALL_FAILED` (1, as a run whose task has a bug: docs/reference/exit-statuses.md).

The words and the times are those of `ctl.report` on the sweep dir too: a
trial's state is `complete`, `pruned`, `failed`, `running` or `waiting`
(`state_word`), and its time runs from its start (a worker claimed it) to its
end, as the study records them (`trial_seconds`), resumed runs and the pauses
between them included.
"""

import datetime
import sys
import threading
from typing import Optional

from optuna.trial import TrialState

from ctl.sweep.study import Study

EXIT_ALL_FAILED = 1
FAILED = TrialState.FAIL
# Optuna's state names as the console, the docs and TensorBoard's HParams (`ctl.sweep.trial`) say them.
WORDS = {"COMPLETE": "complete", "PRUNED": "pruned", "FAIL": "failed", "RUNNING": "running",
         "WAITING": "waiting"}
_SAYING = threading.Lock()


def say(text: str) -> None:
    """Prints one line of the sweep's console whole.

    The workers are threads of one process, and `print` writes a line and its
    end in two calls, between which another thread's line can come: a reader
    (or a test) splitting the output into lines would get two halves.

    Args:
        text: the line, without its end.
    """
    with _SAYING:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()


def state_word(trial) -> str:
    """`trial`'s state as the console says it: complete, pruned, failed, running or waiting.

    Args:
        trial: an Optuna trial of the sweep (`FrozenTrial`).
    """
    return WORDS.get(trial.state.name, trial.state.name.lower())


def trial_seconds(trial) -> Optional[float]:
    """`trial`'s time: from its start to its end (for a running trial: to now), as the study
    records them; None for a trial not started.

    Args:
        trial: an Optuna trial of the sweep (`FrozenTrial`).
    """
    if trial.datetime_start is None:
        return None
    end = trial.datetime_complete or datetime.datetime.now()
    return (end - trial.datetime_start).total_seconds()


def line(study: Study, objective: str) -> str:
    """The console line of the sweep's progress: trials ended, pruned, failed, running, and the best so far.

    Args:
        study: the sweep's study.
        objective: the objective's name.
    """
    counts = study.counts()
    ended = counts["complete"] + counts["pruned"] + counts["fail"]
    best = study.best()
    best_text = (f"best {objective} = {best.value:.6g} (trial {best.number})" if best is not None
                 else "no trial complete yet")
    return (f"{ended}/{study.budget} ended ({counts['complete']} complete, {counts['pruned']} "
            f"pruned, {counts['fail']} failed), {counts['running']} running | {best_text}")
