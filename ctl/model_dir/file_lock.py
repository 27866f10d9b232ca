"""`FileLock`: a claim on a file system (local disk, NFSv4), an exclusive `flock` on the
claim's file with its holder's record in it (`ctl.model_dir.claims` for the interface)."""

import errno
import fcntl
import json
import os
import uuid
from typing import Any, Callable, Optional

from ctl.model_dir import holders


class FileLock:
    """An exclusive `flock` on a local file, with its holder recorded in it. The kernel
    drops it with its holder: never lost, and its record is always readable.

    A `transient` lock's file exists only while it is held: its holder deletes it
    when it releases (a kill leaves it, not held), and a taker's file appears at
    the path with its record whole, so a reader that finds it held can read who
    holds it (the evaluator role decides by that). A taker holds the file at the
    path only: one it locked after the holder deleted it is let go, and the path's
    new file tried.

    Args:
        path: the lock file.
        role: what the holder is, as its record names it.
        transient: the file exists only while the lock is held.
    """

    lost = False
    read_error = None

    def __init__(self, path: str, role: str, transient: bool = False):
        self.path = path
        self.role = role
        self.transient = transient
        self._fd: Optional[int] = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def try_acquire(self, while_settling: Optional[Callable[[], None]] = None) -> bool:
        """Takes the lock if no live process holds it (a file lock settles at once).

        Args:
            while_settling: work that writes nothing, run once the lock is taken.
        """
        taken = self._take()
        if taken and while_settling is not None:
            while_settling()
        return taken

    def _take(self) -> bool:
        if self._fd is not None:
            return True
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        if self.transient:
            return self._take_whole()
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        if not _flock(fd):
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.pwrite(fd, holders.record_line(self.role), 0)
        self._fd = fd
        return True

    def _take_whole(self) -> bool:
        """A transient lock: its file appears at the path with its record whole (written
        aside, then linked, or renamed over a free file left by a kill while that file's
        lock is held), so a reader never finds it held without a holder named."""
        while True:
            try:
                old = os.open(self.path, os.O_RDONLY)
            except FileNotFoundError:
                old = None
            if old is not None and not _flock(old):
                os.close(old)
                return False
            if old is not None and not _same_file(old, self.path):
                os.close(old)  # Deleted by its releasing holder meanwhile: the path's new file.
                continue
            fd, aside = _record_aside(self.path, self.role)
            try:
                if old is None:
                    os.link(aside, self.path)  # Fails if a taker's file appeared meanwhile.
                else:
                    os.rename(aside, self.path)  # This process holds the file it replaces.
            except FileExistsError:
                os.close(fd)
                continue
            finally:
                if old is not None:
                    os.close(old)
                if os.path.exists(aside):
                    os.remove(aside)
            self._fd = fd
            return True

    def held_elsewhere(self) -> bool:
        """Whether another live process holds it now; creates and changes nothing. A file
        found free after a taker replaced it (a transient lock) is looked at again."""
        if self._fd is not None:
            return False
        while True:
            try:
                fd = os.open(self.path, os.O_RDONLY)
            except FileNotFoundError:
                return False
            try:
                if not _flock(fd):
                    return True
                fcntl.flock(fd, fcntl.LOCK_UN)
                if not self.transient or _same_file(fd, self.path):
                    return False
            finally:
                os.close(fd)

    def release(self) -> None:
        if self._fd is not None:
            if self.transient:
                try:
                    os.remove(self.path)  # Still held: no taker has this file yet.
                except FileNotFoundError:
                    pass
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def holder(self) -> str:
        """`pid 4242 on host worker-3 since ...`, from the file (best effort)."""
        return holders.describe(self._record(), self.path)

    def holder_role(self) -> str:
        """The role the holder recorded (e.g. `sidecar evaluator`), best effort."""
        return holders.role_of(self._record())

    def _record(self) -> Any:
        try:
            with open(self.path, "rb") as f:
                return json.loads(f.read().decode() or "{}")
        except (OSError, ValueError):
            return {}


def _flock(fd: int) -> bool:
    """Takes the exclusive `flock` on `fd` if it is free (False: another open file holds it)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise
        return False
    return True


def _record_aside(path: str, role: str):
    """A new file beside `path` holding this process's record, its `flock` taken: (fd, name)."""
    aside = f"{path}.{os.getpid()}-{uuid.uuid4().hex[:8]}"
    fd = os.open(aside, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    _flock(fd)  # A new file: nobody else has it.
    os.write(fd, holders.record_line(role))
    return fd, aside


def _same_file(fd: int, path: str) -> bool:
    """Whether the open file `fd` is the file at `path` now."""
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False
