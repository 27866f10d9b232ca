"""Who evaluates a model dir, and who runs its eval-side hooks: one role, one record.

A trainer in `train_and_eval` and a sidecar (`--mode=continuous_eval`) on one
model dir would both evaluate every checkpoint and both write `eval/`
(TensorBoard would draw each curve twice), and the side effects of
evaluations there (the best checkpoint, exports, early stopping, a user
hook's files) belong to exactly one of them. `EvaluatorRole` is each
process's side of that decision, in one claim of the model dir
(`ctl.model_dir.claims`: an `flock` on a file system, a lease in an object store)
whose record names the evaluator:

    <model_dir>/evaluator.lock   {"role": "sidecar evaluator" | "trainer", "pid", "host", "since", ...}

Its holder runs the eval-side hooks; the file exists while it is held (its
holder deletes it when it lets go; a kill leaves the file, not the claim: the
kernel drops the `flock`, a lease goes stale).

- A sidecar takes the role when it starts (`announce`) and keeps it for as
  long as it lives: that is its announcement. A second sidecar on the same dir
  is told so in one line and evaluates anyway, without the role. A sidecar
  without the role tries again before each evaluation and when it starts to
  wait (`take_over`), so it takes the role once its holder let it go.
- A trainer evaluating in-line holds the role only from the decision to
  evaluate (`steps_aside`, asked once per evaluation, never per train loop) to
  the end of that evaluation's eval-side hooks, and only if it has such hooks.
  While a live sidecar holds the role its in-line evaluation steps aside (one
  line; again when it evaluates in-line again). That is the hand-over: a
  sidecar that starts while a trainer evaluates takes the role between two of
  the trainer's evaluations, and the trainer's next decision finds it taken. A
  record the store does not answer for counts as no sidecar (in-line
  evaluation runs).
- Any other evaluating process (a trainer that never steps aside: a
  multi-worker chief, `--mode=eval`) takes the role before its first
  evaluation with eval-side hooks and keeps it for as long as it lives.
- A process without the role runs none of the eval-side hooks and says so
  once, in a WARNING naming the holder. A lease another process took meanwhile
  (`lost`: its holder was frozen or cut off longer than its staleness window)
  stops them here, said once
  (tests/test_claims.py::test_eval_side_hooks_stop_once_their_lease_is_taken).
  (docs/comforts.md, "Who owns the side effects".)

In an object store, where a read is two requests and a take four and a
second's settling, a trainer's store work is done on a thread of its own: each
evaluation decides by a read started right after the previous decision (after
the previous evaluation's hooks, when it ran them), and the take for an
evaluation runs while it evaluates. Best effort across hosts there: a lease's
age compares the holder's clock with the reader's. Eager, on the host.
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
    `actions` the experiment's eval-side actions (`on_eval_end`), run only by the role's holder."""

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

    def live_sidecar(self) -> Optional[str]:
        """`pid P on host H since T` of a live sidecar holding the role, or None."""
        claim = self.claim
        return claim.holder() if claim.held_elsewhere() and claim.holder_role() == SIDECAR else None

    def steps_aside(self, step: int) -> bool:
        """Whether in-line evaluation steps aside at `step`; evaluating, a trainer with
        eval-side hooks holds the role until they ran (`__call__`)."""
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
                except Exception:  # noqa: BLE001 - only its end is waited for here.
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
        except BaseException as error:  # noqa: B902 - raised on the caller's thread.
            self._error = error

    def result(self) -> Any:
        if self._work is not None:
            self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value
