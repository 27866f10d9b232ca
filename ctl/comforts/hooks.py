"""Hooks: plain callables that run at the seams of a run, and the stop request.

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

    ctl.Experiment.hooks = [@ctl.BestCheckpoint(), @ctl.EarlyStopping()]
"""

import dataclasses
import math
from typing import Any, Callable, Dict, Iterable, List, Optional

from absl import logging
import gin
import orbit
import tensorflow as tf

from ctl.core import config
from ctl.core.errors import UserError

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
            logging.info("stop requested: %s", reason)


@dataclasses.dataclass
class Run:
    """What a hook may read and use: the run's directory, model and step.

    `model` is the model being trained; `eval_model` the one evaluation uses
    and exporters export (with `ctl.Trainer.ema_decay`, the moving average of
    the weights; else `model`). `checkpoint` is the evaluated state, as the
    best checkpoint saves it. On a sidecar evaluator, `checkpoint` is the
    object it restores into and `global_step` the restored step.
    """

    model_dir: str
    model: Any
    checkpoint: tf.train.Checkpoint
    global_step: tf.Variable
    task: Any = None
    strategy: Optional[tf.distribute.Strategy] = None
    chief: bool = True
    stop: StopRequest = dataclasses.field(default_factory=StopRequest)
    # The trainer's `loop_end`: the global step as its last train loop read it.
    loop_end: Dict[str, Any] = dataclasses.field(default_factory=dict)
    eval_model: Any = None

    def __post_init__(self):
        if self.eval_model is None:
            self.eval_model = self.model

    @property
    def step(self) -> int:
        """The global step; right after a train loop, without reading the variable."""
        if "global_step" in self.loop_end:
            return int(self.loop_end["global_step"])
        return int(self.global_step.numpy())


class Hook:
    """Optional base class: `bind` keeps the `Run` as `self.run`; define the hook methods you need."""

    run: Run

    def bind(self, run: Run) -> None:
        self.run = run


class Hooks:
    """Binds a list of hooks to a run and hands out their methods as actions."""

    def __init__(self, hooks: Iterable[Any], run: Run):
        self.hooks: List[Any] = list(hooks)
        self.run = run
        for hook in self.hooks:
            if not any(callable(getattr(hook, name, None)) for name in HOOK_METHODS):
                raise UserError(
                    f"hook {hook!r} has none of the hook methods ({', '.join(HOOK_METHODS)}); "
                    "subclass ctl.Hook and override one of them."
                )
            if callable(getattr(hook, "bind", None)):
                hook.bind(run)

    def actions(self, method: str) -> List[Callable[[Any], None]]:
        """The bound `method` of every hook that has it, in order."""
        return [getattr(h, method) for h in self.hooks if callable(getattr(h, method, None))]

    def call(self, method: str, *args) -> None:
        for action in self.actions(method):
            action(*args)

    def initialize(self) -> None:
        self.call("on_initialize")


def flat_logs(logs, prefix: str = "") -> Dict[str, Any]:
    """`logs` with nested dicts (named eval sets) flattened to "set/name" keys.

    The same names TensorBoard shows: orbit writes a nested dict's values to a
    subdirectory per set.
    """
    flat = {}
    for name, value in (logs or {}).items():
        if isinstance(value, dict):
            flat.update(flat_logs(value, f"{prefix}{name}/"))
        else:
            flat[f"{prefix}{name}"] = value
    return flat


def metric_value(logs, metric: str, hook: str) -> float:
    """`logs[metric]` as a float ("set/name" for a named eval set), or a `UserError`
    naming the metrics there are."""
    flat = flat_logs(logs)
    if metric not in flat:
        raise UserError(
            f"{hook}.metric={metric!r} is not among the evaluation results "
            f"({', '.join(sorted(flat))}); bind {hook}.metric to one of them."
        )
    return float(orbit.utils.get_value(flat[metric]))


def improved(value: float, best: Optional[float], higher_is_better: bool,
             min_delta: float = 0.0) -> bool:
    """Whether `value` beats `best` by more than `min_delta` (NaN never does)."""
    if math.isnan(value):
        return False
    if best is None:
        return True
    return value > best + min_delta if higher_is_better else value < best - min_delta


@gin.configurable(module="ctl")
class EarlyStopping(Hook):
    """Requests a stop once `metric` has not improved for `patience` evaluations.

    The count survives a restart: it is kept (atomically) in
    `<model_dir>/early_stopping.json`.
    """

    def __init__(self, metric: str = "loss", higher_is_better: bool = False,
                 patience: int = 3, min_delta: float = 0.0):
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
            raise UserError(f"ctl.EarlyStopping.patience ({patience!r}) must be a positive integer.")
        self.metric = metric
        self.higher_is_better = higher_is_better
        self.patience = patience
        self.min_delta = min_delta

    def bind(self, run: Run) -> None:
        super().bind(run)
        self.path = f"{run.model_dir}/early_stopping.json"
        state = self._read()
        if state["evaluations_without_improvement"] >= self.patience:  # Stopped before a restart.
            run.stop.request(f"early stopping (recorded in {self.path})")

    def _read(self):
        initial = {"metric": self.metric, "best": None, "evaluations_without_improvement": 0,
                   "step": None}
        state = config.read_json(self.path, initial)
        return state if state.get("metric") == self.metric else initial

    def on_eval_end(self, logs) -> None:
        value = metric_value(logs, self.metric, "ctl.EarlyStopping")
        state = self._read()
        if state["step"] == self.run.step:
            return  # This step was already counted (a restart re-evaluates it).
        if improved(value, state["best"], self.higher_is_better, self.min_delta):
            state.update(best=value, evaluations_without_improvement=0)
        else:
            state["evaluations_without_improvement"] += 1
        state["step"] = self.run.step
        if self.run.chief:
            config.write_json(self.path, state)
        if state["evaluations_without_improvement"] >= self.patience:
            self.run.stop.request(
                f"early stopping: {self.metric} has not improved on {state['best']:.6g} for "
                f"{self.patience} evaluations"
            )
