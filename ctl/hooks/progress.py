"""Metrics for scripts: `<model_dir>/metrics.jsonl`, one JSON object per train loop and evaluation.

    {"kind": "train", "step": 200, "time": 1700000000.0, "loss": 0.31, "accuracy": 0.9, ...}
    {"kind": "eval", "step": 200, "time": 1700000001.5, "loss": 0.35, "accuracy": 0.88}

(The sidecar evaluator keeps its own records in `<model_dir>/eval/metrics.jsonl`.)
`MetricsLog` is a hook (`ctl.hooks`) that ctl adds to every run on the
chief; it runs eagerly on the host. Both files are written by
`ctl.model_dir.JsonLines`. What a run prints is `ctl.utils.console`'s.
"""

import time
from typing import Any, Dict, Optional

import numpy as np
import orbit

from ctl.hooks.eval_results import flat_logs
from ctl.core.hook_protocol import Hook, Run
from ctl.model_dir import JsonLines


def scalars(logs) -> Dict[str, float]:
    """The scalar entries of `logs` as Python floats, named eval sets' as "set/name".

    Args:
        logs: a hook's `logs`, possibly nested by eval set.

    Returns:
        `{name: float}` for every numeric scalar (non-scalars left out).
    """
    values = {}
    for name, value in flat_logs(logs).items():
        if isinstance(value, (float, int, np.number)) and not isinstance(value, bool):
            # The fast path: a loop's results, as NumPy scalars.
            values[name] = float(value)
            continue
        value = np.asarray(orbit.utils.get_value(value))
        if value.size == 1 and np.issubdtype(value.dtype, np.number):
            values[name] = float(value.reshape(()))
    return values


class MetricsLog(Hook):
    """Appends a JSON line per train loop and per evaluation to `<model_dir>/metrics.jsonl`.

    The lines are written by `ctl.model_dir.JsonLines`, in an object store off the
    training thread (`background=True`: what it costs and what a SIGKILL loses is said there).
    """

    def bind(self, run: Run) -> None:
        """Sets the file, `<model_dir>/metrics.jsonl`; nothing is opened yet.

        Args:
            run: the run's `ctl.hooks.Run` (model dir, model, step, stop request), kept as `self.run`.
        """
        super().bind(run)
        self.path = run.directory.metrics_file
        self._lines: Optional[JsonLines] = None  # Made on the first line.

    def on_train_loop_end(self, logs) -> None:
        """Appends a `train` line.

        Args:
            logs: the train loop's results.
        """
        self.append("train", logs)

    def on_eval_end(self, logs) -> None:
        """Appends an `eval` line.

        Args:
            logs: the evaluation's results by metric name (named eval sets nested, `{set: {metric: value}}`).
        """
        self.append("eval", logs)

    def on_trial_close(self, unused_logs) -> None:
        """Closes the file; in an object store, waits for the lines' last upload.

        Args:
            unused_logs: the last evaluation's (or train loop's) results (not read).
        """
        if self._lines is not None:
            self._lines.close()

    def append(self, kind: str, logs: Any) -> None:
        """Appends one JSON line: `kind`, the step, the time and the scalars of `logs`.

        Args:
            kind: `train` or `eval`.
            logs: the results to record.
        """
        if self._lines is None:
            self._lines = JsonLines(self.path, background=True)
        self._lines.append({"kind": kind, "step": self.run.step, "time": time.time(), **scalars(logs)})
