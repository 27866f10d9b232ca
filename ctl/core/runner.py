"""The runner contract: what a train loop hands back, and the extension points that end loops early.

The Trainer (`ctl.core.trainer`) implements orbit's runner protocol
(`train(num_steps)`, `evaluate(num_steps)`); these are the few pieces around
it that other layers name: the `TrainLoopEnd` a train loop returns (the
Controller, the fault handler), and the two objects a Trainer may be given to
end a loop at a step boundary, `StepGuard` and `EvalStop`, which
`ctl.faults` implements (signals, NaN losses) without core naming it.
"""

from typing import Any, Dict, Optional, Protocol

import tensorflow as tf

Logs = Dict[str, Any]

NO_BAD_STEP = -1  # A StepGuard's `bad_step` when every loss was finite.


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


class StepGuard(Protocol):
    """The extension point that may end a train loop early, at a step boundary.

    A Trainer's `step_guard` is None (orbit's loops) or an object like this one;
    `ctl.faults.step_guard.StepGuard` (signals, NaN losses) is ctl's.
    """

    bad_step: tf.Variable  # The step whose loss was not finite, or NO_BAD_STEP.

    def graph_loop(self, step_fn):
        """`loop_fn(iterator, num_steps)` as one `tf.while_loop`; called inside `tf.function`.

        `step_fn` (the Trainer's `train_step`) returns what `check_loss` returned.
        """

    def host_loop(self, step_fn):
        """`loop_fn(iterator, num_steps)` as a Python loop of `step_fn` calls."""

    def should_stop(self) -> tf.Tensor:
        """Whether the loop must end before its next step (graph or eager)."""

    def skip_if_stopped(self, step_fn):
        """`step_fn` that does nothing once `should_stop()`: for steps scheduled ahead (parameter servers)."""

    def check_loss(self, strategy: tf.distribute.Strategy, per_replica_loss,
                   global_step) -> Optional[tf.Tensor]:
        """Called after each step, in cross-replica context, with the step's loss.

        May return a verdict (a bool tensor: may the loop go on) that `train_step`
        hands back to the loop.
        """


class EvalStop(Protocol):
    """The extension point that may end an in-line evaluation early, before its next step.

    A Trainer's `eval_stop` is None (evaluations run to their end) or an object
    like this one; `ctl.faults.preemption.SignalWatcher` (a signal) is ctl's.
    """

    stop_requested: tf.Variable  # A bool: graph eval loops read it before every step.

    def requested(self) -> bool:
        """Whether a stop was requested (eager: between host loop steps, after an evaluation)."""


class EvaluationStopped(Exception):
    """An evaluation ended early on the Trainer's `eval_stop`: its results are incomplete."""
