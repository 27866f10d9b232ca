"""A sidecar evaluator announces itself in the model dir; in-line evaluation steps aside meanwhile.

A trainer in `train_and_eval` and a sidecar (`--mode=continuous_eval`) on one
model dir would both evaluate every checkpoint and both write `eval/`
(TensorBoard would draw each curve twice). The decision: while a live sidecar
serves the dir, the trainer's in-line evaluation steps aside, and says so in
one line (again when it takes over).

    <model_dir>/eval/sidecar.json   {"pid", "host", "since", "heartbeat"}

The sidecar writes the record when it starts (`Announcement`, atomically,
through `ctl.core.model_dir`), rewrites it every `HEARTBEAT_SECONDS` from a
thread of its own (also during a long evaluation) and deletes it when it ends;
a record not rewritten for `STALE_SECONDS` (a killed sidecar) counts as gone.
The trainer reads it once per evaluation (`InLineEvaluation`), never per train
loop. Best effort: the heartbeat compares the sidecar host's clock with the
trainer's. (A piece for `ctl.core.claims` to take over: a role announced in
the model dir with a heartbeat.)
"""

import datetime
import os
import socket
import threading
import time
from typing import Any, Callable, Dict, Optional

import tensorflow as tf

from ctl.core import console
from ctl.core.model_dir import EVAL_DIR, ModelDir, read_json, write_json

ANNOUNCEMENT_FILE = "sidecar.json"  # In EVAL_DIR.
HEARTBEAT_SECONDS = 10.0
STALE_SECONDS = 60.0


def announcement_file(model_dir: str) -> str:
    return ModelDir(model_dir).file(EVAL_DIR, ANNOUNCEMENT_FILE)


class Announcement:
    """The sidecar's side: `with Announcement(model_dir): ...evaluate...` (eager, host)."""

    def __init__(self, model_dir: str, heartbeat_seconds: float = HEARTBEAT_SECONDS):
        self.path = announcement_file(model_dir)
        self.heartbeat_seconds = heartbeat_seconds
        self._record = {"pid": os.getpid(), "host": socket.gethostname(),
                        "since": datetime.datetime.now(datetime.timezone.utc).strftime(
                            "%Y-%m-%dT%H:%M:%SZ")}
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def __enter__(self) -> "Announcement":
        self._beat()
        self._thread = threading.Thread(target=self._keep_beating, daemon=True,
                                        name="ctl-sidecar-heartbeat")
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        try:
            if (read_json(self.path, {}) or {}).get("pid") == self._record["pid"]:
                tf.io.gfile.remove(self.path)
        except tf.errors.OpError:  # Best effort: it goes stale on its own.
            pass

    def _beat(self) -> None:
        write_json(self.path, {**self._record, "heartbeat": time.time()})

    def _keep_beating(self) -> None:
        while not self._stop.wait(self.heartbeat_seconds):
            try:
                self._beat()
            except tf.errors.OpError as error:  # The next beat tries again.
                console.warning("eval", "could not renew %s (%s)", self.path,
                                str(error).splitlines()[0])


def live_sidecar(model_dir: str, clock: Callable[[], float] = time.time) -> Optional[Dict[str, Any]]:
    """The record of a sidecar serving `model_dir` now, or None (none, or stale)."""
    record = read_json(announcement_file(model_dir), None)
    if not isinstance(record, dict) or not isinstance(record.get("heartbeat"), (int, float)):
        return None
    return record if clock() - record["heartbeat"] <= STALE_SECONDS else None


class InLineEvaluation:
    """The trainer's side: whether its in-line evaluation runs, decided once per evaluation.

    `on_step_aside` runs when it starts stepping aside (the trainer releases
    its claim on the eval-side hooks there, for the sidecar to take).
    """

    def __init__(self, model_dir: str, on_step_aside: Callable[[], None] = lambda: None,
                 clock: Callable[[], float] = time.time):
        self.model_dir = model_dir
        self.on_step_aside = on_step_aside
        self.clock = clock
        self.aside = False

    def steps_aside(self, step: int) -> bool:
        sidecar = live_sidecar(self.model_dir, self.clock)
        if sidecar and not self.aside:
            console.info("eval", "a sidecar evaluator (pid %s on host %s, %s) serves %s: in-line "
                         "evaluation steps aside; the sidecar evaluates every checkpoint into "
                         "eval/", sidecar.get("pid"), sidecar.get("host"),
                         announcement_file(self.model_dir), self.model_dir, step=step)
            self.on_step_aside()
        elif not sidecar and self.aside:
            console.info("eval", "no live sidecar evaluator on %s any more: evaluating in-line "
                         "again", self.model_dir, step=step)
        self.aside = bool(sidecar)
        return self.aside
