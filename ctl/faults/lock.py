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

from ctl.core.errors import UserError
from ctl.core.model_dir import Claim, ModelDir


class ModelDirLock:
    """Context manager holding the trainer lock of `model_dir` (eager, host only).

        with ModelDirLock(model_dir):
            ...  # train: no other ctl trainer can write here meanwhile.

    Raises `UserError` on entry if another live process holds the lock.
    """

    def __init__(self, model_dir: str):
        self.model_dir = model_dir
        self._claim = Claim(ModelDir(model_dir).trainer_lock_file, "trainer")
        self.path = self._claim.path

    def acquire(self) -> None:
        if not self._claim.try_acquire():
            raise UserError(
                f"--model_dir={self.model_dir} is in use by another trainer "
                f"({self._claim.holder()}); wait for it to end or stop it, or use "
                "another --model_dir."
            )

    def release(self) -> None:
        self._claim.release()

    def __enter__(self) -> "ModelDirLock":
        self.acquire()
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()
