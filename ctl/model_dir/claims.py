"""Claims on a model dir: which process is the trainer, which runs the eval-side hooks,
whether a sidecar evaluator serves it.

    claim = claim_for(ModelDir(d).file("trainer.lock"), "trainer", wait=True)
    if not claim.try_acquire():
        ...  # claim.holder() names the live process that has it

Two kinds, one interface (`Claim`: `try_acquire`, `release`, `held`, `held_elsewhere`,
`holder`, `holder_role`, `lost`, `read_error`), chosen by `claim_for`: a `FileLock` (an
exclusive `flock`, `ctl.model_dir.file_lock`) on a file system, a `Lease` (a record its holder
renews, `ctl.model_dir.lease`) in an object store. How a lease is taken, renewed and lost, and
what it cannot promise: docs/explanation/model-dir-records.md.
"""

from typing import Callable, Optional, Protocol

from ctl.model_dir.file_lock import FileLock
from ctl.model_dir.files import is_object_store
from ctl.model_dir.lease import Lease


class Claim(Protocol):
    """What both kinds answer (eager, host only)."""

    path: str
    role: str

    @property
    def held(self) -> bool: ...
    @property
    def lost(self) -> bool:
        """Another process took it while this one held it (a lease only)."""
    @property
    def read_error(self) -> Optional[Exception]:
        """Why the last read of its record failed (a lease only): its holder is unknown."""
    def try_acquire(self, while_settling: Optional[Callable[[], None]] = None) -> bool:
        """Takes it if no live process holds it; whether it did.

        Args:
            while_settling: work that writes nothing, run while the claim settles (a lease's
                `SETTLE_SECONDS`), or once it is taken (a file lock).
        """
    def held_elsewhere(self) -> bool: ...
    def release(self) -> None: ...
    def holder(self) -> str: ...
    def holder_role(self) -> str: ...


def claim_for(path: str, role: str, wait: bool = False, transient: bool = False) -> Claim:
    """A `Lease` for a path in an object store (its record always deleted on release), else a
    `FileLock` (`transient`: its file deleted on release).

    Args:
        path: the claim's file or object.
        role: what the holder is, as its record and messages name it (e.g. "trainer").
        wait: a lease taker watches a fresh record of another host for up to `STALE_SECONDS` before it refuses (the
            trainer's lock).
        transient: a file lock's file is deleted on release.
    """
    if is_object_store(path):
        return Lease(path, role, wait=wait)
    return FileLock(path, role, transient=transient)
