"""What to run: a task, its trainer class and the schedule. Configured by gin.

    ctl.Experiment.task = @DigitsTask()
    ctl.Schedule.train_steps = 2000
    ctl.Schedule.eval_interval = 500

Everything here is plain data; `ctl.train_lib` acts on it.
"""

import dataclasses
from typing import Any, Optional, Sequence, Type

import gin

from ctl.utils.errors import UserError
from ctl.core.task import Task
from ctl.core.trainer import Trainer
from ctl.faults.handler import FaultTolerance


@gin.configurable(module="ctl")
@dataclasses.dataclass(frozen=True)
class Schedule:
    """When to train, evaluate, checkpoint and summarize, in global steps.

    Args:
      train_steps: the global step training ends at.
      steps_per_loop: steps per call of the train loop (one log line each).
      eval_steps: batches per evaluation; `None` evaluates the whole eval set.
      eval_interval: `train_and_eval` evaluates at each multiple of it of the
        global step, whatever step a run (re)starts from; `None` evaluates
        only at the end. A final evaluation always runs.
      checkpoint_interval: train steps between checkpoints; one is always
        written at the end.
      max_checkpoints: checkpoints kept in the model dir.
      summary_interval: steps between `tf.summary` calls made inside the train
        step; a multiple of `steps_per_loop`. Loop results (loss, metrics,
        learning rate, steps/sec) are summarized every loop.
      async_checkpointing: write checkpoints on a background thread: training
        waits only for a copy of the variables. A checkpoint becomes visible
        (in the `checkpoint` file, to restores and evaluators) once written.
        In `train_and_eval` the write runs beside the evaluation that follows
        it, and the evaluation's hooks (best checkpoint, exporters) run once
        it is complete; `train` and `train_and_eval` wait for the last one
        before returning.
    """

    train_steps: int = gin.REQUIRED
    steps_per_loop: int = 100
    eval_steps: Optional[int] = None
    eval_interval: Optional[int] = 1000
    checkpoint_interval: int = 1000
    max_checkpoints: int = 5
    summary_interval: Optional[int] = None
    async_checkpointing: bool = False

    def __post_init__(self):
        _require_positive("train_steps", self.train_steps, allow_zero=True)
        for name in ("steps_per_loop", "checkpoint_interval", "max_checkpoints"):
            _require_positive(name, getattr(self, name))
        for name in ("eval_steps", "eval_interval", "summary_interval"):
            if getattr(self, name) is not None:
                _require_positive(name, getattr(self, name))
        if self.summary_interval is not None and self.summary_interval % self.steps_per_loop:
            raise UserError(
                f"ctl.Schedule.summary_interval ({self.summary_interval}) must be a multiple "
                f"of ctl.Schedule.steps_per_loop ({self.steps_per_loop})."
            )
        if not isinstance(self.async_checkpointing, bool):
            raise UserError(
                f"ctl.Schedule.async_checkpointing ({self.async_checkpointing!r}) must be "
                "True or False."
            )


@gin.configurable(module="ctl")
@dataclasses.dataclass(frozen=True)
class Experiment:
    """A task, its trainer class, the schedule, the fault tolerance and hooks (`ctl.hooks`).

    Args:
      task: the `ctl.Task` to train and evaluate (required), e.g.
        `ctl.Experiment.task = @DigitsTask()`.
      schedule: when to train, evaluate, checkpoint and summarize (`ctl.Schedule`).
      trainer_cls: the `ctl.Trainer` subclass that runs the task (default
        `ctl.Trainer`): to change *how* one part of the loop runs (an override point
        of the Trainer's train or eval loop, e.g. `next_train_inputs`), subclass it, register the
        subclass with gin and bind `ctl.Experiment.trainer_cls = @MyTrainer`. The
        trainer and a sidecar evaluator build the same class.
      fault_tolerance: what to do on a NaN loss and how often to check for a stop
        request (`ctl.FaultTolerance`).
      hooks: the hooks the run binds, in order (`ctl.hooks.*` or your own
        `ctl.hooks.Hook` subclasses), e.g. `[@ctl.hooks.BestCheckpoint()]`.
    """

    task: Task = gin.REQUIRED
    schedule: Schedule = dataclasses.field(default_factory=Schedule)
    trainer_cls: Type[Trainer] = Trainer
    fault_tolerance: FaultTolerance = dataclasses.field(default_factory=FaultTolerance)
    hooks: Sequence[Any] = ()

    def __post_init__(self):
        if not isinstance(self.task, Task):
            raise UserError(
                f"ctl.Experiment.task must be a ctl.Task instance, got {self.task!r}; "
                "bind it with `ctl.Experiment.task = @MyTask()`."
            )
        if not (isinstance(self.trainer_cls, type) and issubclass(self.trainer_cls, Trainer)):
            raise UserError(
                f"ctl.Experiment.trainer_cls must be a subclass of ctl.Trainer, got "
                f"{self.trainer_cls!r}."
            )


def _require_positive(name: str, value, allow_zero: bool = False):
    low = 0 if allow_zero else 1
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        kind = "a non-negative" if allow_zero else "a positive"
        raise UserError(
            f"ctl.Schedule.{name} ({value!r}) must be {kind} integer; "
            f"fix it with --gin_bindings='ctl.Schedule.{name} = ...'."
        )
