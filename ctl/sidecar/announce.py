"""A sidecar evaluator announces itself in the model dir; in-line evaluation steps aside meanwhile.

A trainer in `train_and_eval` and a sidecar (`--mode=continuous_eval`) on one
model dir would both evaluate every checkpoint and both write `eval/`
(TensorBoard would draw each curve twice). The decision: while a live sidecar
serves the dir, the trainer's in-line evaluation steps aside, and says so in
one line (again when it takes over).

    <model_dir>/eval/sidecar.json   a `ctl.core.claims.Lease` of the role "sidecar evaluator"

The announcement is a lease on every storage (local, NFS, object store): the
sidecar takes it when it starts (`Announcement`), its thread renews it every
`claims.RENEW_SECONDS` (also during a long evaluation) and it is deleted when
the sidecar ends. A record not renewed for `claims.STALE_SECONDS`, or left by
a process that is gone (a killed sidecar) of the reader's host, boot and PID
namespace, counts as gone; one the store does not answer for counts as no
sidecar (in-line evaluation runs). The trainer reads it once per evaluation (`InLineEvaluation`), never per
train loop. One sidecar is announced at a time: a second one on the same dir
is told so in one line and evaluates anyway. Best effort across hosts: a
record's age compares the sidecar host's clock with the trainer's.
"""

import threading
from typing import Callable, Optional

from ctl.core import console
from ctl.core.claims import Lease
from ctl.core.model_dir import EVAL_DIR, ModelDir, is_object_store

ANNOUNCEMENT_FILE = "sidecar.json"  # In EVAL_DIR.
ROLE = "sidecar evaluator"


def announcement_file(model_dir: str) -> str:
    return ModelDir(model_dir).file(EVAL_DIR, ANNOUNCEMENT_FILE)


class Announcement:
    """The sidecar's side: `with Announcement(model_dir): ...evaluate...` (eager, host)."""

    def __init__(self, model_dir: str):
        self.lease = Lease(announcement_file(model_dir), ROLE)

    def __enter__(self) -> "Announcement":
        if not self.lease.try_acquire():
            console.info("eval", "another sidecar evaluator (%s) is announced in %s: this one "
                         "evaluates too, unannounced", self.lease.holder(), self.lease.path)
        return self

    def __exit__(self, *exc_info) -> None:
        self.lease.release()


def live_sidecar(model_dir: str) -> Optional[str]:
    """`pid P on host H since T` of a live sidecar serving `model_dir`, or None."""
    lease = Lease(announcement_file(model_dir), ROLE)
    return lease.holder() if lease.held_elsewhere() else None


class InLineEvaluation:
    """The trainer's side: whether its in-line evaluation runs, decided once per evaluation.

    `on_step_aside` runs when it starts stepping aside (the trainer releases
    its claim on the eval-side hooks there, for the sidecar to take).
    """

    def __init__(self, model_dir: str, on_step_aside: Callable[[], None] = lambda: None):
        self.model_dir = model_dir
        self.on_step_aside = on_step_aside
        self.aside = False
        self._next: Optional[_Read] = None  # Object stores: the read for the next evaluation.

    def steps_aside(self, step: int) -> bool:
        if self._next is not None:
            sidecar = self._next.result()
        else:
            sidecar = live_sidecar(self.model_dir)
        if is_object_store(self.model_dir):  # Two requests, off the training thread.
            self._next = _Read(self.model_dir)
        if sidecar and not self.aside:
            console.info("eval", "a sidecar evaluator (%s, %s) serves %s: in-line evaluation "
                         "steps aside; the sidecar evaluates every checkpoint into eval/", sidecar,
                         announcement_file(self.model_dir), self.model_dir, step=step)
            self.on_step_aside()
        elif not sidecar and self.aside:
            console.info("eval", "no live sidecar evaluator on %s any more: evaluating in-line "
                         "again", self.model_dir, step=step)
        self.aside = bool(sidecar)
        return self.aside


class _Read:
    """`live_sidecar(model_dir)` on a daemon thread of its own; `result()` waits for it."""

    def __init__(self, model_dir: str):
        self._model_dir = model_dir
        self._sidecar: Optional[str] = None
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._run, daemon=True, name="ctl-sidecar-read")
        self._thread.start()

    def _run(self) -> None:
        try:
            self._sidecar = live_sidecar(self._model_dir)
        except BaseException as error:  # noqa: B902 - raised on the caller's thread.
            self._error = error

    def result(self) -> Optional[str]:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._sidecar
