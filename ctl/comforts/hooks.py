"""Hooks that ship with ctl: early stopping, and the helpers hooks share.

The hook protocol itself (what a hook is, `Run`, `Hooks`, `StopRequest`) is
core's, `ctl.core.hooks`; every hook here is an ordinary one. Named eval sets
reach hooks as nested dicts; `flat_logs` and `metric_value` name their metrics
"set/name".

    ctl.Experiment.hooks = [@ctl.hooks.BestCheckpoint(), @ctl.hooks.EarlyStopping()]
"""

import math
from typing import Any, Dict, Optional

import gin
import orbit

from ctl.core.errors import UserError
from ctl.core.hooks import Hook, Run
from ctl.core.model_dir import read_json, write_json


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


@gin.configurable(module="ctl.hooks")
class EarlyStopping(Hook):
    """Requests a stop once `metric` has not improved for `patience` evaluations.

    The count survives a restart: it is kept (atomically) in
    `<model_dir>/early_stopping.json`.
    """

    def __init__(self, metric: str = "loss", higher_is_better: bool = False,
                 patience: int = 3, min_delta: float = 0.0):
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
            raise UserError(f"ctl.hooks.EarlyStopping.patience ({patience!r}) must be a positive integer.")
        self.metric = metric
        self.higher_is_better = higher_is_better
        self.patience = patience
        self.min_delta = min_delta

    def bind(self, run: Run) -> None:
        super().bind(run)
        self.path = run.directory.early_stopping_file
        state = self._read()
        if state["evaluations_without_improvement"] >= self.patience:  # Stopped before a restart.
            run.stop.request(f"early stopping (recorded in {self.path})")

    def _read(self):
        initial = {"metric": self.metric, "best": None, "evaluations_without_improvement": 0,
                   "step": None}
        state = read_json(self.path, initial)
        return state if isinstance(state, dict) and state.get("metric") == self.metric else initial

    def on_eval_end(self, logs) -> None:
        value = metric_value(logs, self.metric, "ctl.hooks.EarlyStopping")
        state = self._read()
        if state["step"] == self.run.step:
            return  # This step was already counted (a restart re-evaluates it).
        if improved(value, state["best"], self.higher_is_better, self.min_delta):
            state.update(best=value, evaluations_without_improvement=0)
        else:
            state["evaluations_without_improvement"] += 1
        state["step"] = self.run.step
        if self.run.chief:
            write_json(self.path, state)
        if state["evaluations_without_improvement"] >= self.patience:
            self.run.stop.request(
                f"early stopping: {self.metric} has not improved on {state['best']:.6g} for "
                f"{self.patience} evaluations"
            )
