"""The hook protocol: what a hook is, what it sees (`Run`) and the stop request (`ctl.core.stop`).

A hook is any object with some of these methods; ctl calls the ones it has, all eagerly, on
the host, in the order the hooks are listed (`HookProtocol` says when each is called):

    bind(run), on_initialize(), on_checkpoint_load(path), on_train_loop_end(logs),
    on_eval_end(logs), on_checkpoint_end(path), on_trial_close(logs)

Each bound method is an orbit `Action`, so the same hook objects serve ctl's trainer and a
sidecar evaluator (docs/comforts.md). Any hook may end training with
`run.stop.request(reason)`. `Hooks` binds a list of them to a run; `eval_callbacks` collects
the Keras callbacks hooks hold for the Trainer's evaluation. Hooks are listed in gin:

    ctl.Experiment.hooks = [@ctl.hooks.BestCheckpoint(), @ctl.hooks.EarlyStopping()]
"""

import dataclasses
from typing import Any, Callable, Dict, Iterable, List, Optional, Protocol

import tensorflow as tf

from ctl.utils.errors import UserError
# The stop request is defined with every other stop (signals, the second signal's exit);
# it belongs to the hook protocol, and `ctl.hooks` exports it from here.
from ctl.core.stop import StopRequest
from ctl.model_dir import ModelDir

HOOK_METHODS = ("on_initialize", "on_checkpoint_load", "on_train_loop_end", "on_eval_end",
                "on_checkpoint_end", "on_trial_close")


@dataclasses.dataclass
class Run:
    """What a hook may read and use: the run's directory, model and step.

    ctl makes one per run and passes it to each hook's `bind`; a hook reads it,
    and only a test or a program of your own makes one.

    Args:
      directory: the run's `ctl.model_dir.ModelDir` (the names of its
        files); `model_dir` is its path.
      model: the model being trained.
      checkpoint: the evaluated state, as the best checkpoint saves it. On a
        sidecar evaluator, the object it restores into.
      global_step: the step variable; on a sidecar evaluator, the restored step.
        Read `step` rather than this variable.
      task: the run's `ctl.Task` (None when a hook is bound outside a run).
      strategy: the run's `tf.distribute.Strategy` (None: the default strategy).
      chief: whether this process writes the model dir's shared files.
      stop: the run's stop request: `run.stop.request(reason)` ends training at
        the next loop boundary, normally (a checkpoint, then `on_trial_close`).
      step_fn: where `step` comes from once a controller runs (its step, taken
        from each loop's end and each restore: no variable read after a loop);
        None reads `global_step`.
      eval_model: the model evaluation uses and exporters export (with
        `ctl.Trainer.ema_decay`, the moving average of the weights); None means
        `model`.
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
    """Optional base class: `bind` keeps the `Run` as `self.run`; define the hook methods you need
    (`HookProtocol` lists them; a hook must define at least one).

    Example (listed with `ctl.Experiment.hooks = [@PrintSteps()]` once registered with gin):

        @gin.configurable
        class PrintSteps(ctl.hooks.Hook):
            def on_checkpoint_end(self, path):
                print(f"step {self.run.step}: saved {path}")
    """

    run: Run

    def bind(self, run: Run) -> None:
        """Keeps `run` as `self.run`; called once, before anything runs.

        Args:
          run: what the hook may read and use (the model dir, model, step, stop request).
        """
        self.run = run


class HookProtocol(Protocol):
    """The methods ctl calls on a hook, if the hook has them (a description: no need to inherit it).

    Each is called eagerly on the host, in the order the hooks are listed, by the process that
    owns the run's side effects (`on_eval_end`: the one evaluating; see
    [Comforts](../comforts.md)). `logs` map metric names to scalars (NumPy values from ctl's
    controller, tensors from other callers: `float()` them).

    A hook may also hold `eval_callbacks`, Keras callbacks that the Trainer's evaluation itself
    calls around each eval set and batch (`ctl.hooks.KerasCallbacks`, the one route for Keras
    callbacks), wherever it runs: in-line and on a sidecar evaluator, which also calls such a
    hook's `on_trial_close` when it ends normally. Any hook may call `run.stop.request(reason)`:
    `train_and_eval` then stops after the current train loop and its evaluation, saves a
    checkpoint, closes the hooks and returns normally.
    """

    def bind(self, run: Run) -> None:
        """Once, before anything runs: `run` is what the hook may read and use (`Run`).

        Args:
            run: what the hook may read and use (`Run`): the model dir, the model, the step, the stop request.
        """

    def on_initialize(self) -> None:
        """The model dir held no checkpoint: the model starts from its initial weights (a warm
        start loads weights here, `ctl.hooks.WarmStart`)."""

    def on_checkpoint_load(self, path: str) -> None:
        """A checkpoint was restored (a resume, or a sidecar's next checkpoint); `path` is its prefix.

        Args:
            path: the restored checkpoint's prefix (e.g. `DIR/ckpt-500`).
        """

    def on_train_loop_end(self, logs: Dict[str, Any]) -> None:
        """After each train loop (`ctl.Schedule.steps_per_loop` steps): the loop's loss, metrics and
        learning rate.

        Args:
            logs: the loop's results: loss, metrics and learning rate, by name.
        """

    def on_eval_end(self, logs: Dict[str, Any]) -> None:
        """After each evaluation: its loss and metrics; with named eval sets (`Task.eval_datasets`)
        nested by set, `{name: {metric: value}}`.

        Args:
            logs: the evaluation's results by metric name; with named eval sets nested by set.
        """

    def on_checkpoint_end(self, path: str) -> None:
        """A checkpoint was saved at `path` (its prefix, e.g. `DIR/ckpt-500`).

        Args:
            path: the saved checkpoint's prefix (e.g. `DIR/ckpt-500`).
        """

    def on_trial_close(self, logs: Dict[str, Any]) -> None:
        """The run ended normally (its steps done, or a stop request): `logs` are the last
        evaluation's results, or the last train loop's without one.

        Args:
            logs: the last evaluation's results (the last train loop's without an evaluation).
        """


def eval_callbacks(hooks: Iterable[Any]) -> List[Any]:
    """The Keras callbacks every evaluation calls: each hook's `eval_callbacks`, in order.

    Args:
        hooks: the run's hooks (`ctl.Experiment.hooks`).

    Returns:
        The Keras callbacks, in the hooks' order (empty when no hook holds any).
    """
    return [callback for hook in hooks for callback in getattr(hook, "eval_callbacks", ())]


class Hooks:
    """Binds a list of hooks to a run and hands out their methods as actions.

    `builtin` hooks (ctl's progress line and metrics file) come first and
    are told apart from the experiment's (`actions(..., builtin=False)`).

    Args:
        hooks: the experiment's hooks, in the order ctl calls them.
        run: the `Run` each hook is bound to (`bind(run)`), once, here.
        builtin: ctl's own hooks (progress line, metrics file), placed before the experiment's.

    Raises:
        UserError: a hook has none of the hook methods.
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
        with `builtin=True`, only the experiment's with False).

        Args:
            method: a hook method's name, e.g. `on_eval_end`.
            builtin: True: only ctl's own hooks; False: only the experiment's; None: all.

        Returns:
            The bound methods, as orbit actions (`Callable[[Output], None]`).
        """
        hooks = self.hooks
        if builtin is not None:
            hooks = [h for h in hooks if any(h is b for b in self.builtin) == builtin]
        return [getattr(h, method) for h in hooks if callable(getattr(h, method, None))]

    def call(self, method: str, *args) -> None:
        """Calls `method` of every hook that has it, in order, with `args`.

        Args:
            method: a hook method's name, e.g. `on_checkpoint_end`.
            *args: the arguments passed to each.
        """
        for action in self.actions(method):
            action(*args)

    def initialize(self) -> None:
        """The one warm-start route: the model dir holds no checkpoint, so every hook's
        `on_initialize` (e.g. `ctl.hooks.WarmStart`), then the task's `initialize(model)`."""
        self.call("on_initialize")
        if self.run.task is not None:
            self.run.task.initialize(self.run.model)
