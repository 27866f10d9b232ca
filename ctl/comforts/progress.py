"""Everyday output: a progress line per train loop, a terminal bar, JSON lines.

`ProgressLogger` logs a line with step, loss, steps/sec and the time left
(ETA) after a train loop, at most one a second and always for the last loop,
and draws a progress bar on stderr when stderr is a terminal. (A line per loop
cost 0.15 ms of host time here, 1% of a 100-step loop of a small model;
orbit's own line, which ctl's Controller prints per loop, has the loop's
results.) `MetricsLog` appends one JSON object per train loop and one per
evaluation to `<model_dir>/metrics.jsonl`, for scripts:

    {"kind": "train", "step": 200, "time": 1700000000.0, "loss": 0.31, "accuracy": 0.9, ...}
    {"kind": "eval", "step": 200, "time": 1700000001.5, "loss": 0.35, "accuracy": 0.88}

(The sidecar evaluator keeps its own records in `<model_dir>/eval/metrics.jsonl`.)

Both are hooks (ctl.comforts.hooks) and run eagerly on the host; ctl adds them to
every run (MetricsLog on the chief only).
"""

import json
import math
import os
import sys
import time
from typing import Any, Dict, Optional, TextIO

from absl import logging
import numpy as np
import orbit
import tensorflow as tf

from ctl.comforts.hooks import flat_logs
from ctl.core.hooks import Hook, Run

BAR_WIDTH = 30
METRICS_FILE = "metrics.jsonl"


def scalars(logs) -> Dict[str, float]:
    """The scalar entries of `logs` as Python floats, named eval sets' as "set/name"."""
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


def format_duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}"


class ProgressLogger(Hook):
    """A log line per train loop, at most one every `every_seconds`: step, loss, steps/sec, ETA.

    The last loop (the step reaches `train_steps`) always gets its line; a
    bar is drawn on a TTY.
    """

    def __init__(self, train_steps: int, stream: Optional[TextIO] = None,
                 clock=time.monotonic, every_seconds: float = 1.0):
        self.train_steps = train_steps
        self.stream = stream or sys.stderr
        self.clock = clock
        self.every_seconds = every_seconds
        self._last = None  # (time, step) of the last line.
        self._bar_open = False  # A bar is drawn and its line not yet ended.

    def bind(self, run: Run) -> None:
        super().bind(run)
        self._last = (self.clock(), run.step)

    def on_checkpoint_load(self, unused_path) -> None:
        self._last = (self.clock(), self.run.step)  # Do not count restored steps as trained.

    def line(self, step: int, loss: Optional[float], now: float) -> str:
        last_time, last_step = self._last
        rate = (step - last_step) / max(now - last_time, 1e-9)
        eta = (self.train_steps - step) / rate if rate > 0 else float("inf")
        loss_text = f"{loss:.4g}" if loss is not None else "-"
        percent = 100.0 * step / self.train_steps if self.train_steps else 100.0
        return (f"progress | step {step}/{self.train_steps} ({percent:.0f}%) | loss {loss_text} | "
                f"{rate:.1f} steps/sec | ETA {format_duration(eta)}")

    def on_train_loop_end(self, logs) -> None:
        now, step = self.clock(), self.run.step
        if now - self._last[0] < self.every_seconds and step < self.train_steps:
            return
        text = self.line(step, scalars(logs).get("loss"), now)
        self._last = (now, step)
        logging.info("%s", text)
        if self.stream.isatty():
            done = int(BAR_WIDTH * min(step / max(self.train_steps, 1), 1.0))
            self.stream.write(f"\r[{'#' * done}{'.' * (BAR_WIDTH - done)}] {text}")
            self._bar_open = step < self.train_steps
            self.stream.write("" if self._bar_open else "\n")
            self.stream.flush()

    def on_eval_end(self, unused_logs) -> None:
        self._end_bar()  # Evaluation logs its own lines.

    def on_trial_close(self, unused_logs) -> None:
        self._end_bar()

    def _end_bar(self) -> None:
        if self._bar_open:
            self.stream.write("\n")
            self.stream.flush()
            self._bar_open = False


class MetricsLog(Hook):
    """Appends a JSON line per train loop and per evaluation to `<model_dir>/metrics.jsonl`.

    The file stays open between lines (opening it per line cost 0.2 ms after
    a loop); each line is flushed as one write, so readers never see half a
    record and a killed run loses none.
    """

    def bind(self, run: Run) -> None:
        super().bind(run)
        self.path = os.path.join(run.model_dir, METRICS_FILE)
        self._file = None

    def on_train_loop_end(self, logs) -> None:
        self.append("train", logs)

    def on_eval_end(self, logs) -> None:
        self.append("eval", logs)

    def on_trial_close(self, unused_logs) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def append(self, kind: str, logs: Any) -> None:
        record = {"kind": kind, "step": self.run.step, "time": time.time(), **scalars(logs)}
        if self._file is None:
            self._file = tf.io.gfile.GFile(self.path, "a")
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()


def read_metrics(model_dir: str, kind: Optional[str] = None):
    """The records of `<model_dir>/metrics.jsonl` (of one `kind`), oldest first.

    A last line cut short by a kill is skipped.
    """
    path = os.path.join(model_dir, METRICS_FILE)
    if not tf.io.gfile.exists(path):
        return []
    records = []
    with tf.io.gfile.GFile(path) as f:
        for line in f:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return [r for r in records if kind is None or r.get("kind") == kind]
