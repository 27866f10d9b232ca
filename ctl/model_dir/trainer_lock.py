"""One trainer per model dir: a claim that a killed process cannot leave behind.

On a file system the claim is `fcntl.flock` on `<model_dir>/trainer.lock`
(honoured by local file systems and by NFSv4 on Linux). The kernel drops it
when the holding process ends, however it ends (exit, exception, SIGKILL), so a
stale lock never blocks a restart and no PID has to be guessed at. The file
itself stays; it records who holds (or last held) the lock, so that a refused
trainer can name the holder:

    {"role": "trainer", "pid": 4242, "host": "worker-3", "since": "2026-11-22T03:04:05Z", ...}

In an object store (`gs://`, `s3://`), which has no lock, the same file is a
lease that the trainer renews every few seconds and deletes when it ends
(`ctl.model_dir.lease.Lease`: what it catches and what it cannot). A trainer that
finds another host's fresh lease watches it until it is renewed (refused) or
goes stale (taken): after a SIGKILL elsewhere, a restart waits at most
`ctl.model_dir.lease.STALE_SECONDS`. A trainer whose lease another took meanwhile (it
was frozen or cut off longer than that) stops at the end of its next train loop,
before that loop's checkpoint, with one line and exit 2
(`ModelDirLock.stop_if_taken`, `ModelDirTaken`).

A lease settles for a second before its holder knows it has it (`SETTLE_SECONDS`). A trainer
takes it beside its first train loop (`acquire_aside`): the loop computes while the lease
settles and writes nothing, and the first write of the run (the hooks' actions after a loop, a
checkpoint) waits for the lease (`stop_if_taken`); the loop's line and summaries do not, an
object store's summaries staying local until then: a trainer that did not get it stops there
with one line, having written nothing but its own lease record. A check that must pass before the run writes (the eval
step's trace, `ctl.train_lib`) runs on that thread too, on a file system as well: there when the
run first waits for it (after its first train loop: the check takes no CPU from that loop), before
the lock is taken; in an object store while the lease settles (there `ctl.train_lib` takes the
lease before it traces the train step too, and the eval step's check waits for that trace). A run
a check refuses, or whose `reads` fail, stops having written nothing: no lock file, or the lease
record put back as it was (`Lease.undo`: the record its take replaced, or none). At the run's end the lease is renewed
no more while it is fresh (`ending`): its release, last, deletes it without waiting for a renewal.
"""

import threading
from typing import Callable, Optional

from ctl.model_dir.claims import claim_for
from ctl.model_dir.layout import ModelDir
from ctl.model_dir.lease import Lease
from ctl.utils.errors import UserError

TRAINER_LOCK_FILE = "trainer.lock"  # In the model dir: one trainer at a time.


class ModelDirTaken(UserError):
    """Another trainer took the lease of this trainer's model dir while it trained."""


class ModelDirLock:
    """Context manager holding the trainer claim of a model dir (eager, host only).

        with ModelDirLock(directory):
            ...  # train: no other ctl trainer can write here meanwhile.

    Raises `UserError` on entry if another live process holds it.

    Args:
        directory: the run's model dir.
    """

    def __init__(self, directory: ModelDir):
        self.model_dir = directory.path
        self._claim = claim_for(directory.file(TRAINER_LOCK_FILE), "trainer", wait=True)
        self.path = self._claim.path
        self._aside: Optional[threading.Thread] = None  # Taking it aside (`acquire_aside`).
        self._aside_taken = False
        self._aside_error: Optional[BaseException] = None
        # On a file system the checks taken aside start when the run first waits for them.
        self._checks_wanted = threading.Event()
        self._checks_unwanted = False  # The run ended first: they need not run.

    @property
    def settles(self) -> bool:
        """Whether its claim settles before it is known to be held (a lease, in an object store)."""
        return isinstance(self._claim, Lease)

    def stop_if_taken(self, step: int, wait: bool = True) -> None:
        """Raises `ModelDirTaken` if another process took this trainer's claim meanwhile (a
        lease; called after each train loop, and before each write the run makes).

        Args:
            step: the step the loop ended at, for the message.
            wait: False returns at once while a claim taken aside is still being decided
                (its checks or its lease settling): nothing may be written meanwhile, and the
                run's next write waits for it.
        """
        if not wait and self._aside is not None and self._aside.is_alive():
            return
        self.decided()
        if self._claim.held and self._claim.lost:
            raise ModelDirTaken(
                f"--model_dir={self.model_dir} was taken by another trainer "
                f"({self._claim.holder()}) while this one trained: stopped after step {step} "
                "without saving it (two trainers would overwrite each other's checkpoints); "
                "stop one of them, or use another --model_dir.")

    def check(self) -> None:
        """Raises `UserError` if another live trainer holds it; takes nothing, writes nothing.

        Called before the restore: a live trainer's checkpoints come and go under a reader.
        """
        if self._claim.held_elsewhere():
            self._refuse()

    def acquire(self, while_settling: Optional[Callable[[], None]] = None) -> None:
        """Takes it; raises `UserError` if another live trainer holds it.

        Args:
            while_settling: work that writes nothing, run while a lease's record settles
                (`ctl.model_dir.lease.SETTLE_SECONDS`; after a file lock is taken).
        """
        if not self._claim.try_acquire(while_settling):
            self._refuse()

    def acquire_aside(self, reads: Callable[[], None], first_writes: Callable[[], None],
                      checks: Optional[Callable[[], None]] = None) -> None:
        """Takes it; in an object store, or with `checks`, beside the caller, who goes on to
        train (the lease settles, the checks run meanwhile): the run's first write waits for
        it (`decided`, called by `stop_if_taken` before the run's first write, and before the
        run's end). On a file system without checks as `acquire`.

        Args:
            reads: work that writes nothing, run now (while the lease settles).
            first_writes: the run's first writes to the model dir (the dir itself, its config),
                made once the claim is held and the checks passed, on the claim's thread.
            checks: work that must end without an error before anything is written (the eval
                step's trace, `ctl.core.contract.check_eval`; in an object store first the wait
                for a check of `reads`, the train step's trace), run before a file lock is taken
                (its file unmade) or while a lease's record settles (put back as it was after
                an error, `Lease.undo`): its error is raised by `decided`, the claim not held.
                Before a file lock they start when the run first waits for the decision (its
                first write, after its first train loop): they take no CPU from that loop. A
                lease's record settles at once (it is renewed only once held), and so do they.
        """
        if checks is None and not isinstance(self._claim, Lease):
            self.acquire(reads)
            first_writes()
            return

        read: list = []  # Whether `reads` returned; set once it ended.
        reads_ended = threading.Event()

        settling = isinstance(self._claim, Lease)  # Checks while its record settles.
        checked: list = []  # Whether `checks` returned (while settling).

        def check_while_settling() -> None:
            checks()
            checked.append(True)

        def take() -> None:
            try:
                if checks is not None and not settling:
                    self._checks_wanted.wait()
                    if self._checks_unwanted:
                        return  # Nothing taken, nothing written.
                    checks()
                self._aside_taken = self._claim.try_acquire(
                    check_while_settling if checks is not None and settling else None)
                reads_ended.wait()  # The first writes may depend on what they found.
                if self._aside_taken and read:
                    first_writes()
                elif self._aside_taken and isinstance(self._claim, Lease):
                    self._claim.undo()  # The reads failed: nothing written, the store as it was.
                    self._aside_taken = False
            except BaseException as error:  # Raised by `decided`, on the caller's thread.
                self._aside_error = error
                if checks is not None and isinstance(self._claim, Lease) and not checked:
                    self._claim.undo()  # Refused: the store as it was.

        self._aside = threading.Thread(target=take, name="ctl-lease-take", daemon=True)
        self._aside.start()
        try:
            reads()
            read.append(True)
        finally:
            reads_ended.set()

    def decided(self) -> None:
        """Waits for a claim taken aside (`acquire_aside`); raises `UserError` if another live
        trainer has it, or the error taking it raised. Does nothing once decided."""
        if self._aside is None:
            return
        self._join_aside()
        self._aside = None
        if self._aside_error is not None:
            raise self._aside_error
        if not self._aside_taken:
            self._refuse()

    def join_aside(self) -> None:
        """Waits for a claim taken aside (`acquire_aside`) to be decided, raising nothing
        (`decided` raises what it found): a run that ends on an error of its own first."""
        if self._aside is not None:
            self._join_aside(unwanted=True)

    def _join_aside(self, unwanted: bool = False) -> None:
        if not self._checks_wanted.is_set():  # Waited for: the checks start now,
            self._checks_unwanted = unwanted  # unless the run ended without them.
            self._checks_wanted.set()
        self._aside.join()

    def ending(self) -> None:
        """The run's end: its claim is released soon (a lease renews no more while fresh)."""
        if isinstance(self._claim, Lease):
            self._claim.ending()

    def _refuse(self) -> None:
        raise UserError(
            f"--model_dir={self.model_dir} is in use by another trainer "
            f"({self._claim.holder()}); wait for it to end or stop it, or use "
            "another --model_dir."
        )

    def release(self) -> None:
        if self._aside is not None:  # Still settling: let it decide, then let go.
            self._join_aside(unwanted=True)
            self._aside = None
        self._claim.release()

    def __enter__(self) -> "ModelDirLock":
        self.acquire()
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()
