"""One trainer per model dir: an advisory lock that a killed process cannot leave behind.

The lock is `fcntl.flock` on `<model_dir>/trainer.lock`. The kernel drops it
when the holding process ends, however it ends (exit, exception, SIGKILL), so a
stale lock never blocks a restart and no PID has to be guessed at. The file
itself stays; it records who holds (or last held) the lock, so that a refused
trainer can name the holder:

    {"pid": 4242, "host": "worker-3", "since": "2026-11-22T03:04:05Z"}

`flock` is honoured by local file systems (and by NFSv4 on Linux); on object
stores (`gs://`, `s3://`) there is nothing to lock and `ModelDirLock` warns and
lets the run go on unguarded.
"""

import datetime
import errno
import fcntl
import json
import os
import socket
from typing import Optional


from ctl.core import console
from ctl.core.errors import UserError

LOCK_FILE = "trainer.lock"


class ModelDirLock:
    """Context manager holding the trainer lock of `model_dir` (eager, host only).

        with ModelDirLock(model_dir):
            ...  # train: no other ctl trainer can write here meanwhile.

    Raises `UserError` on entry if another live process holds the lock.
    """

    def __init__(self, model_dir: str):
        self.model_dir = model_dir
        self.path = os.path.join(model_dir, LOCK_FILE)
        self._fd: Optional[int] = None

    def acquire(self) -> None:
        if "://" in self.model_dir:
            console.warning("lock", "cannot lock %s (not a local path): make sure one trainer runs "
                            "on it at a time.", self.model_dir)
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            os.close(fd)
            if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise UserError(
                f"--model_dir={self.model_dir} is in use by another trainer "
                f"({describe_holder(self.path)}); wait for it to end or stop it, or use "
                "another --model_dir."
            ) from None
        holder = {"pid": os.getpid(), "host": socket.gethostname(),
                  "since": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "ModelDirLock":
        self.acquire()
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()


def describe_holder(path: str) -> str:
    """`pid 4242 on host worker-3 since ...`, from the lock file (best effort)."""
    try:
        with open(path) as f:
            holder = json.loads(f.read() or "{}")
        return f"pid {holder['pid']} on host {holder['host']} since {holder['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return f"holder unknown, see {path}"
