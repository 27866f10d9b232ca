"""The runner contract: what a train loop hands back, and how an evaluation says it was stopped.

The Trainer (`ctl.core.trainer`) implements orbit's runner protocol
(`train(num_steps)`, `evaluate(num_steps)`); these are the few pieces around
it that other layers name: the `TrainLoopEnd` a train loop returns (the
Controller, the fault handler), and `EvaluationStopped`, raised by an
evaluation that the Trainer's stop source ended before its end.
"""

from typing import Any, Dict, NamedTuple, Optional

Logs = Dict[str, Any]

NO_BAD_STEP = -1  # A step guard's `bad_step` when every loss was finite (`ctl.core.loops.StepGuard`).


class TrainLoopEnd(NamedTuple):
    """What one train loop hands back (`Trainer.train`): its results and where it ended.

    Plain values, handed from the trainer to the controller and from there to
    whatever runs after the loop (the fault handler, train actions, hooks), so
    nothing has to remember to refresh a shared copy when a restore moves the
    global step: whoever restores returns a new `TrainLoopEnd`
    (`end._replace(step=..., restored=path)`).
    """

    logs: Logs
    step: int  # The global step the loop ended at.
    bad_step: Optional[int] = None  # The step whose loss was NaN or Inf (with a step guard).
    restored: Optional[str] = None  # Set by a handler that restored this checkpoint after the loop.


class EvaluationStopped(Exception):
    """An evaluation ended early on the Trainer's stop source (`eval_stop`): its results are incomplete."""
