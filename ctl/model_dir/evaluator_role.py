"""Who evaluates a model dir, and who runs its eval-side hooks: one role, one record.

`EvaluatorRole` is each process's side of that decision, in one claim of the model dir
(`ctl.model_dir.claims`) whose record names the evaluator:

    <model_dir>/evaluator.lock   {"role": "sidecar evaluator" | "trainer", "pid", "host", ...}

A sidecar takes the role when it starts and keeps it; a trainer evaluating in-line holds it
only around each evaluation's eval-side hooks, and steps aside while a live sidecar holds it
(`steps_aside`); a process without the role runs none of the eval-side hooks. The hand-over,
and how it works in an object store: docs/explanation/model-dir-records.md. Eager, on the host.
"""

import threading
from typing import Any, Callable, Iterable, Optional

from ctl.model_dir.claims import Claim, claim_for
from ctl.model_dir.files import is_object_store
from ctl.model_dir.layout import ModelDir
from ctl.utils import console

TRAINER = "trainer"
SIDECAR = "sidecar evaluator"


class EvaluatorRole:
    """One process's part in evaluating `directory`: `role` is `TRAINER` or `SIDECAR`;
    `actions` the experiment's eval-side actions (`on_eval_end`), run only by the role's holder.

    Args:
        directory: the model dir evaluated.
        role: `TRAINER` or `SIDECAR`.
        actions: the experiment's eval-side actions (`on_eval_end`), run only by the role's holder.
    """

    def __init__(self, directory: ModelDir, role: str,
                 actions: Iterable[Callable[[Any], None]] = ()):
        self.directory = directory
        self.role = role
        self.actions = list(actions)
        self.claim: Claim = claim_for(directory.evaluator_file, role, transient=True)
        self._in_store = is_object_store(directory.path)
        self._owned: Optional[bool] = None  # Decided at the first evaluation with actions.
        self._said_elsewhere = False
        self._aside = False
        self._next_read: Optional[_OnThread] = None  # Object stores: the next decision's read.
        self._taken: Optional[_OnThread] = None  # A trainer's take for the evaluation it runs.

    @property
    def owned(self) -> Optional[bool]:
        """Whether this process runs the eval-side hooks (None: not decided yet)."""
        return self._owned

    # The sidecar's side.

    def announce(self) -> None:
        """Takes the role for this sidecar's life (let go by `release`)."""
        if not self.claim.try_acquire() and self.claim.holder_role() != TRAINER:
            console.info("eval", "another sidecar evaluator (%s) is announced in %s: this one "
                         "evaluates too, unannounced", self.claim.holder(), self.claim.path)

    def take_over(self) -> None:
        """The role, if this sidecar does not hold it and its holder let it go (a trainer
        between two in-line evaluations, a sidecar that ended)."""
        if self.claim.held or not self.claim.try_acquire():
            return
        if self.actions and self._owned is False:
            self._owned = True
            console.info("hooks", "the eval-side hooks run here from now on (%s)", self.claim.path)

    # The trainer's side.

    def read_ahead(self) -> None:
        """In an object store, starts now, on a thread, the read the first in-line evaluation's
        decision takes (as each evaluation starts the next one's): a trainer calls it as its run starts."""
        if self._in_store and self._next_read is None:
            self._next_read = _OnThread(self.live_sidecar)

    def live_sidecar(self) -> Optional[str]:
        """`pid P on host H since T` of a live sidecar holding the role, or None."""
        claim = self.claim
        return claim.holder() if claim.held_elsewhere() and claim.holder_role() == SIDECAR else None

    def steps_aside(self, step: int) -> bool:
        """Whether in-line evaluation steps aside at `step`; evaluating, a trainer with
        eval-side hooks holds the role until they ran (`__call__`).

        Args:
            step: the step of the evaluation about to run.
        """
        if self.actions and not self._in_store:
            taken = self.claim.try_acquire()  # Holding it, no sidecar can take it.
            sidecar = None if taken or self.claim.holder_role() != SIDECAR else self.claim.holder()
            self._taken = None if sidecar else _OnThread.done(taken)
        else:
            sidecar = self._next_read.result() if self._next_read is not None else self.live_sidecar()
            self._next_read = None
            if self._in_store and self.actions and not sidecar:
                self._taken = _OnThread(self.claim.try_acquire)  # While it evaluates.
            elif self._in_store:
                self._next_read = _OnThread(self.live_sidecar)
        if sidecar and not self._aside:
            console.info("eval", "a sidecar evaluator (%s, %s) serves %s: in-line evaluation "
                         "steps aside; the sidecar evaluates every checkpoint into eval/", sidecar,
                         self.claim.path, self.directory.path, step=step)
        elif not sidecar and self._aside:
            console.info("eval", "no live sidecar evaluator on %s any more: evaluating in-line "
                         "again", self.directory.path, step=step)
        self._aside = bool(sidecar)
        return self._aside

    # Both: the eval-side hooks, an eval action.

    def __call__(self, logs) -> None:
        if self._taken is not None:  # A trainer's in-line evaluation: held for it alone.
            taken, self._taken = self._taken.result(), None
            try:
                if taken and not self.claim.lost:
                    self._run(logs)
                else:
                    self._say_held_elsewhere()
            finally:
                if self._in_store:  # The next decision's read, after the delete.
                    self._next_read = _OnThread(self._release_and_read if taken else
                                                self.live_sidecar)
                elif taken:
                    self.claim.release()
            return
        if not self.actions:
            return
        claim = self.claim
        if self._owned is None:
            self._owned = claim.try_acquire()
            if not self._owned and claim.read_error is not None:
                self._owned = None  # Its record could not be read: asked again next time.
            if not self._owned:
                self._say_held_elsewhere()
        if self._owned and claim.lost:  # A lease another process took.
            self._owned = False
            console.warning(
                "hooks", "the eval-side hooks (%s) stop running in this process: the %s (%s) took "
                "their claim (%s); each side effect of a model dir has one owner (docs/comforts.md).",
                self._names(), claim.holder_role(), claim.holder(), claim.path)
        if self._owned:
            self._run(logs)

    def _run(self, logs) -> None:
        for action in self.actions:
            action(logs)

    def _say_held_elsewhere(self) -> None:
        """One WARNING naming the holder (said at each evaluation while it is unknown)."""
        claim = self.claim
        if claim.read_error is not None:
            console.warning("hooks", "the eval-side hooks (%s) skip this evaluation: %s",
                            self._names(), claim.holder())
            return
        if self._said_elsewhere:
            return
        self._said_elsewhere = True
        console.warning(
            "hooks", "the eval-side hooks (%s) do not run in this process: the %s (%s) owns "
            "them (%s); each side effect of a model dir has one owner (docs/comforts.md).",
            self._names(), claim.holder_role(), claim.holder(), claim.path)

    def _names(self) -> str:
        return ", ".join(sorted({type(getattr(a, "__self__", a)).__name__ for a in self.actions}))

    def _release_and_read(self) -> Optional[str]:
        self.claim.release()
        return self.live_sidecar()

    def release(self) -> None:
        """Lets the role go (when the process's run ends), after the store work in flight."""
        for pending in (self._taken, self._next_read):
            if pending is not None:
                try:
                    pending.result()
                except Exception:  # Only its end is waited for here.
                    pass
        self.claim.release()


class _OnThread:
    """`work()` on a daemon thread of its own; `result()` waits for it (and raises its error)."""

    def __init__(self, work: Optional[Callable[[], Any]] = None):
        self._work = work
        self._value: Any = None
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._run, daemon=True, name="ctl-sidecar-read")
        if work is not None:
            self._thread.start()

    @classmethod
    def done(cls, value: Any) -> "_OnThread":
        """One whose work is already done, on the caller's thread: `value`."""
        finished = cls()
        finished._value = value
        return finished

    def _run(self) -> None:
        try:
            self._value = self._work()
        except BaseException as error:  # Raised on the caller's thread.
            self._error = error

    def result(self) -> Any:
        if self._work is not None:
            self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value
