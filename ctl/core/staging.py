"""Local staging for a model dir in an object store: one root per process, never left behind.

With its model dir in an object store (`gs://`), a run writes its checkpoints
(`ctl.core.checkpointing`) and summaries (`ctl.core.summaries`) to a local
directory and uploads them (`ctl.core.background`), and the sidecar copies a
checkpoint's files to one before it restores them. Each such directory is made
here, under the process's staging root, `<tmp>/ctl-staging-<pid>-<random>/`
(`tempfile.gettempdir()`: `$TMPDIR`, else /tmp):

    local = staging.directory("checkpoints")   # a new directory under the root
    ...
    staging.remove(local)                       # by its owner, when done (in a `finally`)

The root is made at the first `directory()` and removed when the process exits.
A process that is killed (SIGKILL, the out-of-memory killer) removes nothing:
the next process to make its root removes the roots of processes that are gone
first. A root's process is alive while it holds an `flock` on the root, taken
when the root is made, dropped by the kernel when the process ends however it
ends: a live process's root is never touched (a reused pid, or another pid
namespace sharing the directory, changes nothing).
"""

import atexit
import fcntl
import os
import shutil
import tempfile
import threading
from typing import Optional

PREFIX = "ctl-staging-"
_MAKING = ".ctl-staging-new-"  # A root being made: not yet locked, never cleared.

_lock = threading.Lock()
_root: Optional[str] = None
_root_fd: Optional[int] = None  # Open for the process's life: holds the flock.
_root_pid: Optional[int] = None


def directory(name: str) -> str:
    """A new, empty directory `<root>/<name>-<random>` for the caller to fill and `remove()`."""
    return tempfile.mkdtemp(prefix=f"{name}-", dir=root())


def remove(path: str) -> None:
    """Removes a directory of `directory()` and everything in it (nothing if it is gone)."""
    shutil.rmtree(path, ignore_errors=True)


def root() -> str:
    """This process's staging root, made (after clearing those of dead processes) at the first call."""
    global _root, _root_fd, _root_pid
    with _lock:
        if _root is None or _root_pid != os.getpid():  # A forked child makes its own.
            parent = tempfile.gettempdir()
            clear_dead_roots(parent)
            _root, _root_fd = _make_root(parent)
            if _root_pid is None:
                atexit.register(_remove_root)
            _root_pid = os.getpid()
        return _root


def current_root() -> Optional[str]:
    """This process's staging root if one was made, else None (never makes one)."""
    return _root if _root_pid == os.getpid() else None


def clear_dead_roots(parent: str) -> None:
    """Removes the staging roots in `parent` whose process has ended (their flock is free)."""
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        if not name.startswith(PREFIX):
            continue
        path = os.path.join(parent, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:  # Gone meanwhile, or not a directory.
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # Held: its process is alive.
            os.close(fd)
            continue
        try:
            shutil.rmtree(path, ignore_errors=True)
        finally:
            os.close(fd)


def _make_root(parent: str):
    """A new root, locked before it takes its name: `clear_dead_roots` never sees it unlocked."""
    making = tempfile.mkdtemp(prefix=_MAKING, dir=parent)
    fd = os.open(making, os.O_RDONLY | os.O_DIRECTORY)  # Not inherited by child processes.
    fcntl.flock(fd, fcntl.LOCK_EX)
    path = os.path.join(parent, f"{PREFIX}{os.getpid()}-{os.path.basename(making)[len(_MAKING):]}")
    os.rename(making, path)
    return path, fd


def _remove_root() -> None:
    """At exit: the root and everything in it (its owners' `remove` came first, where they ran)."""
    if _root is not None and _root_pid == os.getpid():
        shutil.rmtree(_root, ignore_errors=True)
        os.close(_root_fd)
