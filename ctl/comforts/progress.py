"""Metrics for scripts: `<model_dir>/metrics.jsonl`, one JSON object per train loop and evaluation.

    {"kind": "train", "step": 200, "time": 1700000000.0, "loss": 0.31, "accuracy": 0.9, ...}
    {"kind": "eval", "step": 200, "time": 1700000001.5, "loss": 0.35, "accuracy": 0.88}

(The sidecar evaluator keeps its own records in `<model_dir>/eval/metrics.jsonl`.)
`MetricsLog` is a hook (`ctl.hooks`) that ctl adds to every run on the
chief; it runs eagerly on the host. What a run prints is `ctl.utils.console`'s.
"""

import json
import time
from typing import Any, Dict, List, Optional

import numpy as np
import orbit
import tensorflow as tf

from ctl.comforts.eval_results import flat_logs
from ctl.core.hook_protocol import Hook, Run
from ctl.model_dir.background import uploads
from ctl.model_dir import is_object_store, read_text, write_atomically


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

    The file stays open between lines (opening it per line cost time after
    every loop: docs/bench.md); each line is flushed as one write, so readers never see half a
    record and a killed run loses none. In an object store, where an append
    uploads the whole file again, the lines are kept in memory and the file
    is uploaded whole from `ctl.model_dir.background` (one upload queued at a time,
    each with every line so far); a SIGKILL loses the lines not yet uploaded.
    """

    def bind(self, run: Run) -> None:
        """Sets the file, `<model_dir>/metrics.jsonl`; nothing is opened yet.

        Args:
            run: the run's `ctl.hooks.Run` (model dir, model, step, stop request), kept as `self.run`.
        """
        super().bind(run)
        self.path = run.directory.metrics_file
        self._file: Optional[Any] = None  # A GFile, opened on the first line.
        self._lines: Optional[List[str]] = None  # Object stores: every line of the file.
        self._queued = False

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
        """Closes the file.

        Args:
            unused_logs: the last evaluation's (or train loop's) results (not read).
        """
        if self._file is not None:
            self._file.close()
            self._file = None

    def append(self, kind: str, logs: Any) -> None:
        """Appends one JSON line: `kind`, the step, the time and the scalars of `logs`.

        Args:
            kind: `train` or `eval`.
            logs: the results to record.
        """
        record = {"kind": kind, "step": self.run.step, "time": time.time(), **scalars(logs)}
        if is_object_store(self.path):
            self._append_in_store(json.dumps(record) + "\n")
            return
        if self._file is None:
            # tf.io.gfile, for a local path too: with Python's own file, figure 1's MLP ran
            # slower, though a line alone cost less (docs/bench.md).
            self._file = tf.io.gfile.GFile(self.path, "a")
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def _append_in_store(self, line: str) -> None:
        if self._lines is None:
            text = read_text(self.path) or ""
            self._lines = [text + ("\n" if text and not text.endswith("\n") else "")]
        self._lines.append(line)
        if not self._queued:
            self._queued = True
            uploads().submit(self._upload)

    def _upload(self) -> None:
        self._queued = False  # Lines appended from now on queue the next upload.
        write_atomically(self.path, "".join(list(self._lines)))

