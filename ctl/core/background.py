"""Writes to an object store off the training thread: in order, on one thread of their own.

A request to `gs://` takes tens of milliseconds, and a write is a whole upload
(an object store cannot append): a loop that waited for each write would wait
for the store several times a second. Checkpoints (`ctl.core.checkpointing`), summaries
(`ctl.core.summaries`) and `metrics.jsonl` (`ctl.comforts.progress`) are
written locally, or kept in memory, and their uploads are handed to the
process's `Uploads`:

    uploads().submit(copy_file, local, remote)   # returns at once
    ...
    uploads().wait()   # every upload submitted so far is done (or its error raised)

One thread runs the uploads first in, first out, so what was submitted first
is in the store first (a checkpoint's summaries before the checkpoint, the
data files before the index). The first error is raised again on the caller's
thread by the next `submit`, `wait` or `check`, so a failing store ends the
run like a failing local disk. A run waits for its uploads before it ends, and before
exit 75 after a signal; a SIGKILL loses the uploads still queued (the last
checkpoint named in the bucket's state file is whole: its index and state
file are uploaded after its data). What the store's latency still costs the
main job is bench figure 9 (BUILD.md).

On a file system nothing is handed here: writes are cheap and go to disk at once.
"""

import queue
import threading
from typing import Callable, Optional


class Uploads:
    """A FIFO of upload functions run on one daemon thread (started at the first submit)."""

    def __init__(self, name: str = "ctl-uploads"):
        self._name = name
        self._queue: "queue.Queue[Optional[Callable[[], None]]]" = queue.Queue()
        self._thread: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None
        self._lock = threading.Lock()

    def submit(self, fn: Callable, *args) -> None:
        """Queues `fn(*args)`; raises the error of an earlier upload, if one failed."""
        self.check()
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
        self._queue.put(lambda: fn(*args))

    def wait(self) -> None:
        """Returns once every upload submitted so far ran; raises the first error of one."""
        if self._thread is not None:
            self._queue.join()
        self.check()

    @property
    def pending(self) -> int:
        """Uploads submitted and not yet done (the one running included)."""
        return self._queue.unfinished_tasks

    def check(self) -> None:
        """Raises the error of an upload that failed since the last check (once)."""
        with self._lock:  # The uploads thread may be storing one right now.
            error, self._error = self._error, None
        if error is not None:
            raise error

    def _run(self) -> None:
        while True:
            task = self._queue.get()
            try:
                task()
            except BaseException as error:  # noqa: B902 - raised on the caller's thread.
                with self._lock:
                    if self._error is None:  # The first one is what the caller hears of.
                        self._error = error
            finally:
                self._queue.task_done()


_UPLOADS = Uploads()


def uploads() -> Uploads:
    """The process's uploads (one thread, so that everything lands in the order submitted)."""
    return _UPLOADS
