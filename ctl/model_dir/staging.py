"""Local staging for a model dir in an object store: one root per process, never left behind.

    local = staging.directory("checkpoints")   # a new directory under the root
    ...
    staging.remove(local)                       # by its owner, when done (in a `finally`)

The root, `<tmp>/ctl-stage-<pid>-<random>/`, is made at the first `directory()` and removed
when the process exits; the roots of killed processes are removed by the next process to make
its root (`clear_dead_roots`: a root is alive while its process holds the claim on its
`.owner`). docs/explanation/model-dir-records.md says more.
"""

import atexit
import os
import shutil
import tempfile
import threading
from typing import Optional

from ctl.model_dir.file_lock import FileLock

PREFIX = "ctl-stage-"  # Not "ctl-staging-": roots of older ctl (a flock on the directory) stay theirs.
OWNER_FILE = ".owner"  # In a root: its process's claim.
_MAKING = ".ctl-stage-new-"  # A root being made: not yet claimed, never cleared.

_lock = threading.Lock()
_root: Optional[str] = None
_root_owner: Optional[FileLock] = None  # Held for the process's life.
_root_pid: Optional[int] = None


def directory(name: str) -> str:
    """A new, empty directory `<root>/<name>-<random>` for the caller to fill and `remove()`.

    Args:
        name: the directory's name, before its random suffix.
    """
    return tempfile.mkdtemp(prefix=f"{name}-", dir=root())


def remove(path: str) -> None:
    """Removes a directory of `directory()` and everything in it (nothing if it is gone).

    Args:
        path: a directory `directory()` made.
    """
    shutil.rmtree(path, ignore_errors=True)


def root() -> str:
    """This process's staging root, made (after clearing those of dead processes) at the first call."""
    global _root, _root_owner, _root_pid
    with _lock:
        if _root is None or _root_pid != os.getpid():  # A forked child makes its own.
            parent = tempfile.gettempdir()
            clear_dead_roots(parent)
            _root, _root_owner = _make_root(parent)
            if _root_pid is None:
                atexit.register(_remove_root)
            _root_pid = os.getpid()
        return _root


def current_root() -> Optional[str]:
    """This process's staging root if one was made, else None (never makes one)."""
    return _root if _root_pid == os.getpid() else None


def clear_dead_roots(parent: str) -> None:
    """Removes the staging roots in `parent` whose process has ended (their claim is free;
    a dead root is never claimed again, so the look and the removal need no lock between).

    Args:
        parent: the directory the staging roots are in (the temporary directory).
    """
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        path = os.path.join(parent, name)
        if not name.startswith(PREFIX) or not os.path.isdir(path):
            continue
        try:
            if FileLock(os.path.join(path, OWNER_FILE), "staging").held_elsewhere():
                continue  # Its process is alive.
        except OSError:  # Gone meanwhile.
            continue
        shutil.rmtree(path, ignore_errors=True)


def _make_root(parent: str):
    """A new root, claimed before it takes its name: `clear_dead_roots` never sees it free."""
    making = tempfile.mkdtemp(prefix=_MAKING, dir=parent)
    owner = FileLock(os.path.join(making, OWNER_FILE), "staging")  # Not inherited by children.
    owner.try_acquire()  # A new file: nobody else has it.
    path = os.path.join(parent, f"{PREFIX}{os.getpid()}-{os.path.basename(making)[len(_MAKING):]}")
    os.rename(making, path)  # The flock stays with the open file.
    return path, owner


def _remove_root() -> None:
    """At exit: the root and everything in it (its owners' `remove` came first, where they ran)."""
    if _root is not None and _root_pid == os.getpid():
        shutil.rmtree(_root, ignore_errors=True)
        _root_owner.release()
