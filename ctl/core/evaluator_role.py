"""Who evaluates a model dir, and who runs its eval-side hooks: one role, one object.

A trainer in `train_and_eval` and a sidecar (`--mode=continuous_eval`) on one
model dir would both evaluate every checkpoint and both write `eval/`
(TensorBoard would draw each curve twice), and the side effects of
evaluations there (the best checkpoint, exports, early stopping, a user
hook's files) belong to exactly one of them. `EvaluatorRole` is each
process's side of that decision, in two claims of the model dir
(`ctl.core.claims`: an `flock` on a file system, a lease in an object store):

    <model_dir>/eval/sidecar.json   a live sidecar's announcement (`announce`)
    <model_dir>/eval_hooks.lock     the owner of the eval-side hooks (`__call__`)

- The sidecar announces itself when it starts; the claim dies with it, and its
  file is deleted when it ends (a kill leaves the file, not the claim). One
  sidecar is announced at a time: a second one on the same dir is told so in
  one line and evaluates anyway.
- The trainer asks once per evaluation (`steps_aside`), never per train loop:
  while a live sidecar is announced its in-line evaluation steps aside (one
  line; again when it takes over) and it lets the eval-side hooks go, for the
  sidecar to take at its next evaluation (`take_over`). An announcement the
  store does not answer for counts as no sidecar (in-line evaluation runs).
- The eval-side hooks: before its first evaluation with such hooks a process
  tries to take their claim; the one that gets it runs them for as long as it
  lives, the other never does and says so once, in a WARNING naming the owner.
  A lease another process took meanwhile (`lost`: its holder was frozen or
  cut off longer than its staleness window) stops them here, said once
  (tests/test_claims.py::test_eval_side_hooks_stop_once_their_lease_is_taken).
  (docs/comforts.md, "Who owns the side effects".)

Best effort across hosts in an object store: a lease's age compares the
holder's clock with the reader's. Eager, on the host.
"""

import threading
from typing import Any, Callable, Iterable, Optional

from ctl.core import console
from ctl.core.claims import Claim, claim_for, eval_hooks_claim
from ctl.core.model_dir import ModelDir, is_object_store

TRAINER = "trainer"
SIDECAR = "sidecar evaluator"


class EvaluatorRole:
    """One process's part in evaluating `directory`: `role` is `TRAINER` or `SIDECAR`;
    `actions` the experiment's eval-side actions (`on_eval_end`), run only while owned."""

    def __init__(self, directory: ModelDir, role: str,
                 actions: Iterable[Callable[[Any], None]] = ()):
        self.directory = directory
        self.role = role
        self.actions = list(actions)
        self.hooks_claim: Claim = eval_hooks_claim(directory, role)
        self.announcement: Claim = claim_for(directory.announcement_file, SIDECAR, transient=True)
        self._owned: Optional[bool] = None  # Decided at the first evaluation with actions.
        self._aside = False
        self._next_read: Optional[_ReadAhead] = None  # Object stores: the next evaluation's read.

    @property
    def owned(self) -> Optional[bool]:
        """Whether this process runs the eval-side hooks (None: not decided yet)."""
        return self._owned

    # The sidecar's side.

    def announce(self) -> None:
        """Announces this sidecar (released by `release`)."""
        if not self.announcement.try_acquire():
            console.info("eval", "another sidecar evaluator (%s) is announced in %s: this one "
                         "evaluates too, unannounced", self.announcement.holder(),
                         self.announcement.path)

    def take_over(self) -> None:
        """The eval-side hooks, once a trainer that held them stepped aside and let them go."""
        if self.actions and self._owned is False and self.hooks_claim.try_acquire():
            self._owned = True
            console.info("hooks", "the eval-side hooks run here from now on (%s)",
                         self.hooks_claim.path)

    # The trainer's side.

    def live_sidecar(self) -> Optional[str]:
        """`pid P on host H since T` of a live sidecar serving the model dir, or None."""
        return self.announcement.holder() if self.announcement.held_elsewhere() else None

    def steps_aside(self, step: int) -> bool:
        """Whether in-line evaluation steps aside at `step`; stepping aside, the trainer lets
        the eval-side hooks go (taken again if in-line evaluation comes back). In an object
        store, where a read is two requests, each evaluation decides by a read started right
        after the previous decision on a thread of its own: a sidecar's coming and going is
        seen one evaluation later there."""
        sidecar = self._next_read.result() if self._next_read is not None else self.live_sidecar()
        if is_object_store(self.directory.path):
            self._next_read = _ReadAhead(self.live_sidecar)
        if sidecar and not self._aside:
            console.info("eval", "a sidecar evaluator (%s, %s) serves %s: in-line evaluation "
                         "steps aside; the sidecar evaluates every checkpoint into eval/", sidecar,
                         self.announcement.path, self.directory.path, step=step)
            if self._owned:
                self.hooks_claim.release()
                self._owned = None
        elif not sidecar and self._aside:
            console.info("eval", "no live sidecar evaluator on %s any more: evaluating in-line "
                         "again", self.directory.path, step=step)
        self._aside = bool(sidecar)
        return self._aside

    # Both: the eval-side hooks, an eval action.

    def __call__(self, logs) -> None:
        if not self.actions:
            return
        claim = self.hooks_claim
        if self._owned is None:
            self._owned = claim.try_acquire()
            if not self._owned and claim.read_error is not None:
                self._owned = None  # Its record could not be read: asked again next time.
                console.warning("hooks", "the eval-side hooks (%s) skip this evaluation: %s",
                                self._names(), claim.holder())
            elif not self._owned:
                console.warning(
                    "hooks", "the eval-side hooks (%s) do not run in this process: the %s (%s) owns "
                    "them (%s); each side effect of a model dir has one owner (docs/comforts.md).",
                    self._names(), claim.holder_role(), claim.holder(), claim.path)
        if self._owned and claim.lost:  # A lease another process took.
            self._owned = False
            console.warning(
                "hooks", "the eval-side hooks (%s) stop running in this process: the %s (%s) took "
                "their claim (%s); each side effect of a model dir has one owner (docs/comforts.md).",
                self._names(), claim.holder_role(), claim.holder(), claim.path)
        if self._owned:
            for action in self.actions:
                action(logs)

    def _names(self) -> str:
        return ", ".join(sorted({type(getattr(a, "__self__", a)).__name__ for a in self.actions}))

    def release(self) -> None:
        """Lets both claims go (when the process's run ends)."""
        try:
            self.hooks_claim.release()
        finally:
            self.announcement.release()


class _ReadAhead:
    """`read()` on a daemon thread of its own; `result()` waits for it (and raises its error)."""

    def __init__(self, read: Callable[[], Optional[str]]):
        self._read = read
        self._value: Optional[str] = None
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._run, daemon=True, name="ctl-sidecar-read")
        self._thread.start()

    def _run(self) -> None:
        try:
            self._value = self._read()
        except BaseException as error:  # noqa: B902 - raised on the caller's thread.
            self._error = error

    def result(self) -> Optional[str]:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value
