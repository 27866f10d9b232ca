"""The hook protocol: what a hook is, what it sees (`Run`) and the stop request.

A hook is any object with some of these methods; ctl calls the ones it has,
all eagerly, on the host, in the order the hooks are listed:

    bind(run)                     once, before anything runs: the `Run` below
    on_initialize()               the model dir holds no checkpoint (warm start)
    on_checkpoint_load(path)      a checkpoint was restored
    on_train_loop_end(logs)       after each train loop (orbit train action)
    on_eval_end(logs)             after each evaluation (orbit eval action)
    on_checkpoint_end(path)       a checkpoint was saved
    on_trial_close(logs)          the run ended normally; `logs` are the last
                                  evaluation's (or train loop's) results

`logs` map names to scalars (NumPy values from ctl's controller, tensors from
other callers; `float()` them). Each of
these bound methods is an orbit `Action` (`Callable[[Output], None]`), so the
same hook objects serve ctl's trainer and a sidecar evaluator (docs/comforts.md).

Any hook may call `run.stop.request(reason)`: `train_and_eval` then stops
after the current train loop and its evaluation, saves a checkpoint, closes the
hooks and returns normally (the Supervisor's `should_stop`).

Hooks are listed in gin:

    ctl.Experiment.hooks = [@ctl.hooks.BestCheckpoint(), @ctl.hooks.EarlyStopping()]
"""

import dataclasses
from typing import Any, Callable, Iterable, List, Optional

import tensorflow as tf

from ctl.core import console
from ctl.core.errors import UserError
from ctl.core.model_dir import ModelDir

HOOK_METHODS = ("on_initialize", "on_checkpoint_load", "on_train_loop_end", "on_eval_end",
                "on_checkpoint_end", "on_trial_close")


class StopRequest:
    """A flag any hook may raise; the controller stops at the next boundary."""

    def __init__(self):
        self.reason: Optional[str] = None

    @property
    def should_stop(self) -> bool:
        return self.reason is not None

    def request(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
            console.info("stop", "stop requested: %s", reason)


@dataclasses.dataclass
class Run:
    """What a hook may read and use: the run's directory, model and step.

    `directory` is the run's `ctl.core.model_dir.ModelDir` (the names of its
    files); `model_dir` its path.

    `model` is the model being trained; `eval_model` the one evaluation uses
    and exporters export (with `ctl.Trainer.ema_decay`, the moving average of
    the weights; else `model`). `checkpoint` is the evaluated state, as the
    best checkpoint saves it. On a sidecar evaluator, `checkpoint` is the
    object it restores into and `global_step` the restored step.
    """

    directory: ModelDir
    model: Any
    checkpoint: tf.train.Checkpoint
    global_step: tf.Variable
    task: Any = None
    strategy: Optional[tf.distribute.Strategy] = None
    chief: bool = True
    stop: StopRequest = dataclasses.field(default_factory=StopRequest)
    # Where the current step comes from once a controller runs (its `step`,
    # taken from each loop's end and each restore: no variable read after a
    # loop); before that, and on a sidecar evaluator, the variable.
    step_fn: Optional[Callable[[], int]] = None
    eval_model: Any = None

    def __post_init__(self):
        if self.eval_model is None:
            self.eval_model = self.model

    @property
    def model_dir(self) -> str:
        return self.directory.path

    @property
    def step(self) -> int:
        """The global step."""
        if self.step_fn is not None:
            return int(self.step_fn())
        return int(self.global_step.numpy())


class Hook:
    """Optional base class: `bind` keeps the `Run` as `self.run`; define the hook methods you need."""

    run: Run

    def bind(self, run: Run) -> None:
        self.run = run


class Hooks:
    """Binds a list of hooks to a run and hands out their methods as actions.

    `builtin` hooks (ctl's progress line and metrics file) come first and
    are told apart from the experiment's (`actions(..., builtin=False)`).
    """

    def __init__(self, hooks: Iterable[Any], run: Run, builtin: Iterable[Any] = ()):
        self.builtin: List[Any] = list(builtin)
        self.hooks: List[Any] = self.builtin + list(hooks)
        self.run = run
        for hook in self.hooks:
            if not any(callable(getattr(hook, name, None)) for name in HOOK_METHODS):
                raise UserError(
                    f"hook {hook!r} has none of the hook methods ({', '.join(HOOK_METHODS)}); "
                    "subclass ctl.hooks.Hook and override one of them."
                )
            if callable(getattr(hook, "bind", None)):
                hook.bind(run)

    def actions(self, method: str, builtin: Optional[bool] = None) -> List[Callable[[Any], None]]:
        """The bound `method` of every hook that has it, in order (only ctl's own hooks
        with `builtin=True`, only the experiment's with False)."""
        hooks = self.hooks
        if builtin is not None:
            hooks = [h for h in hooks if any(h is b for b in self.builtin) == builtin]
        return [getattr(h, method) for h in hooks if callable(getattr(h, method, None))]

    def call(self, method: str, *args) -> None:
        for action in self.actions(method):
            action(*args)

    def initialize(self) -> None:
        self.call("on_initialize")

