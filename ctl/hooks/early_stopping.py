"""Early stopping: a stop requested once a metric stops improving.

An ordinary hook (the protocol is `ctl.core.hook_protocol`'s); the metric is
read as `ctl.hooks.eval_results` reads it ("set/name" for a named eval set).

    ctl.Experiment.hooks = [@ctl.hooks.BestCheckpoint(), @ctl.hooks.EarlyStopping()]
"""

import gin

from ctl.hooks.eval_results import improved, metric_value
from ctl.utils.errors import UserError
from ctl.core.hook_protocol import Hook, Run
from ctl.model_dir import read_json, write_json

EARLY_STOPPING_FILE = "early_stopping.json"  # In the model dir: the count, kept across restarts.


@gin.configurable(module="ctl.hooks")
class EarlyStopping(Hook):
    """Requests a stop once `metric` has not improved for `patience` evaluations.

    The count survives a restart: it is kept (atomically) in
    `<model_dir>/early_stopping.json`.

    Args:
        metric: the evaluation result compared, by name (`"set/name"` for a named eval set, e.g. `"val/accuracy"`).
        higher_is_better: True when a larger value is better (accuracy), False when smaller is (loss).
        patience: evaluations without an improvement before the stop (a positive integer).
        min_delta: how much a value must beat the best by to count as an improvement.

    Raises:
        UserError: `patience` is not a positive integer.
    """

    def __init__(self, metric: str = "loss", higher_is_better: bool = False,
                 patience: int = 3, min_delta: float = 0.0):
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
            raise UserError(f"ctl.hooks.EarlyStopping.patience ({patience!r}) must be a positive integer.")
        self.metric = metric
        self.higher_is_better = higher_is_better
        self.patience = patience
        self.min_delta = min_delta

    # Alike `BestExporter.bind` in shape: each hook reads, when bound, the record it keeps across
    # restarts. Two records: a count of evaluations without improvement here, the best value there.
    def bind(self, run: Run) -> None:
        """Reads the count a previous process kept; requests the stop at once if it had stopped.

        Args:
            run: the run's `ctl.hooks.Run` (model dir, model, step, stop request), kept as `self.run`.
        """
        super().bind(run)
        self.path = run.directory.file(EARLY_STOPPING_FILE)
        state = self._read()
        if state["evaluations_without_improvement"] >= self.patience:  # Stopped before a restart.
            run.stop.request(f"early stopping (recorded in {self.path})")

    def _read(self):
        initial = {"metric": self.metric, "best": None, "evaluations_without_improvement": 0,
                   "step": None}
        state = read_json(self.path, initial)
        return state if isinstance(state, dict) and state.get("metric") == self.metric else initial

    def on_eval_end(self, logs) -> None:
        """Counts an evaluation without improvement (once per step), and requests the stop at `patience`.

        Args:
            logs: the evaluation's results by metric name (named eval sets nested, `{set: {metric: value}}`).
        """
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
