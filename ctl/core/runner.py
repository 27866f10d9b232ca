"""The runner contract: what a train loop and an evaluation hand back, and how an evaluation says it was stopped.

The Trainer (`ctl.core.trainer`) implements orbit's runner protocol
(`train(num_steps)`, `evaluate(num_steps)`); these are the few pieces around
it that other layers name: the `TrainLoopEnd` a train loop returns (the
Controller, the fault handler), the `EvaluationEnd` an evaluation returns (the
Controller), and `EvaluationStopped`, raised by an evaluation that the
Trainer's stop source ended before its end.
"""

from typing import Any, Dict, Optional

Logs = Dict[str, Any]

NO_BAD_STEP = -1  # A step guard's `bad_step` when every loss was finite (`ctl.core.loops.StepGuard`).


class TrainLoopEnd(dict):
    """What one train loop hands back (`Trainer.train`): its results, and where it ended.

    A dict of the loop's results, as `orbit.AbstractTrainer.train` returns
    (orbit's Controller adds its own entries to it), that also says where the
    loop ended: `step`, the global step; `bad_step`, the step whose loss was NaN
    or Inf (with a step guard); `restored`, set by a handler that restored this
    checkpoint after the loop. Handed from the trainer to the controller and
    from there to whatever runs after the loop (the fault handler, train
    actions, hooks), so nothing has to remember to refresh a shared copy when a
    restore moves the global step: whoever restores returns a new one
    (`end._replace(step=..., restored=path)`). Built without arguments (as
    `tf.nest` copies a dict) it knows no step.

    Args:
        logs: the loop's results (loss, metrics, learning rate); None: empty.
        step: the global step the loop ended at (None: unknown).
        bad_step: the step whose loss was NaN or Inf, found by a step guard; None: none.
        restored: the checkpoint a handler restored after the loop, or None.
    """

    def __init__(self, logs: Optional[Logs] = None, step: Optional[int] = None,
                 bad_step: Optional[int] = None, restored: Optional[str] = None):
        super().__init__(logs or {})
        self.step = step
        self.bad_step = bad_step
        self.restored = restored

    @property
    def logs(self) -> Logs:
        """The loop's results, as a plain dict."""
        return dict(self)

    def _replace(self, **changes) -> "TrainLoopEnd":
        """A copy with some of `logs`, `step`, `bad_step`, `restored` changed."""
        fields = dict(logs=self.logs, step=self.step, bad_step=self.bad_step,
                      restored=self.restored)
        unknown = set(changes) - set(fields)
        if unknown:
            raise TypeError(f"TrainLoopEnd has no field {sorted(unknown)[0]!r}.")
        return TrainLoopEnd(**{**fields, **changes})

    def __repr__(self) -> str:
        """Its results, and where the loop ended if known (a copy by `tf.nest` knows nothing)."""
        fields = ", ".join(f"{name}={value!r}" for name, value in (
            ("step", self.step), ("bad_step", self.bad_step), ("restored", self.restored))
            if value is not None)
        return f"TrainLoopEnd({dict(self)!r}, {fields})" if fields else repr(dict(self))


class EvaluationEnd(dict):
    """What one evaluation hands back (`Evaluation.evaluate`): its results, and how many batches it read.

    A dict of the results, as `orbit.AbstractEvaluator.evaluate` returns
    (`{name: results}` for named eval sets), that also says `steps`, the batches
    read over all eval sets, and `steps_asked`, the batches asked for (the
    steps of the evaluation times the eval sets; None: each set to its end).
    An eval set that ends before the steps asked for ends its evaluation there,
    as orbit's loops and Model Garden's trainer end it, with the results over
    what was read: then `steps < steps_asked`. Built without arguments (as
    `tf.nest` copies a dict) it knows no steps.

    Args:
        logs: the results; None: empty.
        steps: the batches read, over all eval sets (None: unknown).
        steps_asked: the batches asked for, over all eval sets (None: each set to its end).
    """

    def __init__(self, logs: Optional[Logs] = None, steps: Optional[int] = None,
                 steps_asked: Optional[int] = None):
        super().__init__(logs or {})
        self.steps = steps
        self.steps_asked = steps_asked

    @property
    def data_ended(self) -> bool:
        """Whether an eval set ended before the steps asked for."""
        return None not in (self.steps, self.steps_asked) and self.steps < self.steps_asked


class EvaluationStopped(Exception):
    """An evaluation ended early on the Trainer's stop source (`eval_stop`): its results are incomplete."""
