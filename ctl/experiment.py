"""What to run: a task, its trainer class and the schedule. Configured by gin.

    ctl.Experiment.task = @DigitsTask()
    ctl.Schedule.train_steps = 2000
    ctl.Schedule.eval_interval = 500

Everything here is plain data; `ctl.train_lib` acts on it.

A task whose own config holds settings of the run (`Task.config_settings`: a Model Garden
experiment's `trainer` and `runtime`) gives them to its `Experiment`, which takes each where
you set nothing. Precedence: a setting you give ctl (a gin binding, or in Python a value other
than ctl's default) wins over the task's config; the task's config wins over ctl's defaults.
`Experiment.sources` says, one line per setting away from ctl's default, where each came from;
the run prints them at its start.
"""

import dataclasses
import inspect
from typing import Annotated, Any, Dict, List, Mapping, Optional, Sequence, Tuple, Type

import gin

from ctl.hooks.best import BestCheckpoint
from ctl.config import gin_config
from ctl.config.arguments import Range, check_arguments
from ctl.utils.errors import UserError
from ctl.core.task import ConfigSetting, Task
from ctl.core.trainer import Trainer
from ctl.faults.handler import FaultTolerance
from ctl.sidecar.scheduler import ContinuousEval


_POSITIVE = Range(at_least=1)


@gin.configurable(module="ctl")
@check_arguments  # Each setting's type and range, as a user's configurable declares them.
@dataclasses.dataclass(frozen=True)
class Schedule:
    """When to train, evaluate, checkpoint and summarize, in global steps.

    Args:
      train_steps: the global step training ends at.
      steps_per_loop: steps per call of the train loop (one log line each).
      eval_steps: batches per evaluation; `None` evaluates the whole eval set. An
        eval set that ends first ends its evaluation there, with the results over
        the batches it had (the console's eval line says so).
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

    train_steps: Annotated[int, Range(at_least=0)] = gin.REQUIRED  # Or the task's config's.
    steps_per_loop: Annotated[int, _POSITIVE] = 100
    eval_steps: Annotated[Optional[int], _POSITIVE] = None
    eval_interval: Annotated[Optional[int], _POSITIVE] = 1000
    checkpoint_interval: Annotated[int, _POSITIVE] = 1000
    max_checkpoints: Annotated[int, _POSITIVE] = 5
    summary_interval: Annotated[Optional[int], _POSITIVE] = None
    async_checkpointing: bool = False

    def __post_init__(self):
        if self.summary_interval is not None and self.summary_interval % self.steps_per_loop:
            raise UserError(
                f"ctl.Schedule.summary_interval ({self.summary_interval}) must be a multiple "
                f"of ctl.Schedule.steps_per_loop ({self.steps_per_loop})."
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
        `ctl.hooks.Hook` subclasses), e.g. `[@ctl.hooks.BestCheckpoint()]`; then the task's
        config's (`Task.config_hooks`, and a `ctl.hooks.BestCheckpoint` its settings ask for).
      trainer_args: arguments `trainer_cls` is built with beyond gin's; the task's config's
        `ctl.Trainer` settings (`Task.config_settings`) are added where gin binds none.
      continuous_eval: the sidecar's settings (None: `ctl.ContinuousEval` as gin configures
        it); made from the task's config's `ctl.ContinuousEval` settings when it has some.
      sources: the lines the run's start prints: each setting away from ctl's default that
        the task's config gave, or that yours overrode (made here; given, kept first).

    `schedule` and `fault_tolerance` left None are `ctl.Schedule` and `ctl.FaultTolerance` as
    gin configures them; in both, the task's config's settings fill every field you did not set
    (a gin binding, or a value other than ctl's default).
    """

    task: Task = gin.REQUIRED
    schedule: Schedule = None  # type: ignore[assignment]  # Made in __post_init__.
    trainer_cls: Type[Trainer] = Trainer
    fault_tolerance: FaultTolerance = None  # type: ignore[assignment]  # Made in __post_init__.
    hooks: Sequence[Any] = ()
    trainer_args: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    continuous_eval: Optional[ContinuousEval] = None
    sources: Tuple[str, ...] = ()

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
        _Settle(self).apply()


def _gin_bound(name: str) -> bool:
    """Whether gin binds `name` (`ctl.Schedule.train_steps`)."""
    try:
        gin.query_parameter(name)
    except ValueError:
        return False
    return True


class _Settle:
    """Fills an `Experiment` in place from its task's config settings (`Task.config_settings`)."""

    OWNERS = ("ctl.Schedule", "ctl.FaultTolerance", "ctl.Trainer", "ctl.ContinuousEval",
              "ctl.hooks.BestCheckpoint")

    def __init__(self, experiment: "Experiment"):
        self.experiment = experiment
        self.lines: List[str] = list(experiment.sources)
        self.by_owner: Dict[str, Dict[str, ConfigSetting]] = {owner: {} for owner in self.OWNERS}
        for setting in experiment.task.config_settings():
            owner, _, parameter = setting.name.rpartition(".")
            if owner in self.by_owner:
                self.by_owner[owner][parameter] = setting

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self.experiment, name, value)

    def _line(self, line: str) -> None:
        if line not in self.lines:  # An Experiment made again from one (`dataclasses.replace`).
            self.lines.append(line)

    def _taken(self, setting: ConfigSetting, ctl_default: Any) -> None:
        if setting.value != ctl_default:
            self._line(f"{setting.name} = {setting.value!r}  (the experiment's {setting.source})")

    def _kept(self, setting: ConfigSetting, value: Any) -> None:
        if value != setting.value:
            self._line(f"{setting.name} = {value!r}  (your setting; the experiment's "
                       f"{setting.source} = {setting.value!r} is not used)")

    def _split(self, owner: str, current: Mapping[str, Any], defaults: Mapping[str, Any]
               ) -> Dict[str, Any]:
        """The task's settings of `owner` that nothing you set overrides; lines for each."""
        taken = {}
        for parameter, setting in self.by_owner[owner].items():
            if _gin_bound(setting.name):
                self._kept(setting, current.get(parameter, gin.query_parameter(setting.name)))
            elif parameter in current and current[parameter] != defaults.get(parameter):
                self._kept(setting, current[parameter])
            else:
                taken[parameter] = setting.value
                self._taken(setting, defaults.get(parameter))
        return taken

    def apply(self) -> None:
        experiment = self.experiment
        self._settings_object("schedule", Schedule, "ctl.Schedule")
        self._settings_object("fault_tolerance", FaultTolerance, "ctl.FaultTolerance")
        defaults = {name: parameter.default for name, parameter in
                    inspect.signature(experiment.trainer_cls.__init__).parameters.items()}
        trainer = self._split("ctl.Trainer", {}, defaults)
        self._set("trainer_args", {**trainer, **experiment.trainer_args})
        if self.by_owner["ctl.ContinuousEval"] and experiment.continuous_eval is None:
            taken = self._split("ctl.ContinuousEval", {}, {"timeout": ContinuousEval.timeout})
            self._set("continuous_eval", _made(ContinuousEval, None, taken,
                                               self.by_owner["ctl.ContinuousEval"]))
        self._best_checkpoint()
        extra = [hook for hook in experiment.task.config_hooks()
                 if not any(type(hook) is type(own) for own in experiment.hooks)]
        if extra:
            self._set("hooks", (*experiment.hooks, *extra))
        self._set("sources", tuple(self.lines))

    def _settings_object(self, field: str, cls, owner: str) -> None:
        """The experiment's `field` (a `cls` dataclass, gin's `owner`), with the settings it takes."""
        instance = getattr(self.experiment, field)
        defaults = {f.name: f.default for f in dataclasses.fields(cls)}
        current = dataclasses.asdict(instance) if instance is not None else {}
        taken = self._split(owner, current, defaults)
        if cls is Schedule:
            self._summaries_on_loop_ends(taken, current, defaults)
        if instance is None or taken:
            instance = _made(cls, instance, taken, self.by_owner[owner])
        self._set(field, instance)

    def _summaries_on_loop_ends(self, taken: Dict[str, Any], current: Mapping[str, Any],
                                defaults: Mapping[str, Any]) -> None:
        """The experiment's summary interval, rounded up to a multiple of the loop you set (orbit
        wants one; Model Garden's own YAML keeps them in step, a loop of yours need not)."""
        every = taken.get("summary_interval")
        if not every or "steps_per_loop" in taken:
            return
        if _gin_bound("ctl.Schedule.steps_per_loop"):
            loop = current.get("steps_per_loop", gin.query_parameter("ctl.Schedule.steps_per_loop"))
        else:
            loop = current.get("steps_per_loop", defaults.get("steps_per_loop"))
        if not isinstance(loop, int) or loop <= 0 or every % loop == 0:
            return
        taken["summary_interval"] = -(-every // loop) * loop
        self._line(f"ctl.Schedule.summary_interval = {taken['summary_interval']!r}  (the experiment's "
                   f"{self.by_owner['ctl.Schedule']['summary_interval'].source} = {every!r}, rounded up "
                   f"to a multiple of your ctl.Schedule.steps_per_loop = {loop!r}, as orbit requires)")

    def _best_checkpoint(self) -> None:
        settings = self.by_owner["ctl.hooks.BestCheckpoint"]
        if not settings:
            return
        own = [hook for hook in self.experiment.hooks if isinstance(hook, BestCheckpoint)]
        if own:
            for setting in settings.values():
                self._kept(setting, getattr(own[0], setting.name.rsplit(".", 1)[1], None))
            return
        defaults = {"metric": "loss", "higher_is_better": False, "export_subdir": None}
        taken = self._split("ctl.hooks.BestCheckpoint", {}, defaults)
        self._set("hooks", (*self.experiment.hooks, BestCheckpoint(**taken)))


def _made(cls, instance, values: Mapping[str, Any], settings: Mapping[str, ConfigSetting]):
    """`instance` with `values` (None: `cls` as gin configures it, with `values` for the
    parameters gin does not bind); a value it refuses is named with its source."""
    try:
        if instance is None:
            return gin_config.call_configured(lambda: cls(**values))
        return dataclasses.replace(instance, **values)
    except UserError as error:
        if not values:
            raise
        sources = ", ".join(f"{settings[name].source}={value!r}" for name, value in values.items())
        raise UserError(f"{error} (the experiment's {sources})") from error

