"""Writes to an object store off the training thread: in order, on threads of their own.

Checkpoints, summaries and `metrics.jsonl` are written locally (or kept in memory) and their
uploads handed to the process's `Uploads`:

    uploads().submit(upload, local, remote)   # returns at once
    ...
    uploads().wait()   # every upload submitted so far is done (or its error raised)

Four lanes (`FILES`, `CHECKPOINT_FILES`, `CHECKPOINTS`, `RETIREMENTS`), each first in, first out on a thread of
its own; the first error is raised again on the caller's thread. On a file system nothing is
handed here. The lanes' order, and what the store's latency costs:
docs/explanation/model-dir-records.md.
"""

import queue
import threading
from typing import Callable, Optional, Sequence

import tensorflow as tf

_CHUNK_BYTES = 16 << 20


def upload(local: str, remote: str) -> None:
    """Writes the local file `local` to `remote` (replaced if it is there), in chunks.

    Args:
        local: the local file.
        remote: its path in the object store.
    """
    with open(local, "rb") as source, tf.io.gfile.GFile(remote, "wb") as target:
        while True:
            chunk = source.read(_CHUNK_BYTES)
            if not chunk:
                break
            target.write(chunk)


FILES = "files"  # Summaries and metrics.jsonl.
CHECKPOINT_FILES = "checkpoint_files"  # A checkpoint's files, while the one before is published.
CHECKPOINTS = "checkpoints"  # The state file naming each checkpoint, in the order saved.
RETIREMENTS = "retirements"  # Deletes of checkpoints the state file no longer names.


class Uploads:
    """FIFO lanes of upload functions, each run on a daemon thread of its own (started at its
    first submit): what one lane was handed lands in that order; lanes overlap.

    Args:
        name: the prefix of the lanes' thread names.
        lanes: the lanes' names (`FILES`, `CHECKPOINT_FILES`, `CHECKPOINTS`, `RETIREMENTS`).
    """

    def __init__(self, name: str = "ctl-uploads",
                 lanes=(FILES, CHECKPOINT_FILES, CHECKPOINTS, RETIREMENTS)):
        self._lanes = {lane: _Lane(f"{name}-{lane}", self._store) for lane in lanes}
        self._error: Optional[BaseException] = None
        self._lock = threading.Lock()

    def submit(self, fn: Callable, *args, lane: str = FILES) -> None:
        """Queues `fn(*args)` on `lane`; raises the error of an earlier upload, if one failed.

        Args:
            fn: the upload function.
            lane: the lane it waits in.
            *args: its arguments.
        """
        self.check()
        self._lanes[lane].submit(lambda: fn(*args))

    def mark(self, lane: str = FILES) -> int:
        """How many uploads `lane` was handed so far (for `wait_for`).

        Args:
            lane: a lane's name.
        """
        return self._lanes[lane].submitted

    def wait_for(self, lane: str, mark: int) -> None:
        """Returns once the first `mark` uploads of `lane` ran (done or failed), e.g. on another
        lane's thread: what was handed to `lane` before `mark()` lands first.

        Args:
            lane: the lane waited for.
            mark: what `mark(lane)` returned.
        """
        self._lanes[lane].wait_for(mark)

    def wait(self, lanes: Optional[Sequence[str]] = None) -> None:
        """Returns once every upload submitted so far ran (of `lanes`); raises the first error of one.

        Args:
            lanes: the lanes waited for (None: all of them).
        """
        for name, lane in self._lanes.items():
            if lanes is None or name in lanes:
                lane.wait_for(lane.submitted)
        self.check()

    @property
    def pending(self) -> int:
        """Uploads submitted and not yet done (the ones running included)."""
        return sum(lane.submitted - lane.done for lane in self._lanes.values())

    def check(self) -> None:
        """Raises the error of an upload that failed since the last check (once)."""
        with self._lock:  # An uploads thread may be storing one right now.
            error, self._error = self._error, None
        if error is not None:
            raise error

    def _store(self, error: BaseException) -> None:
        with self._lock:
            if self._error is None:  # The first one is what the caller hears of.
                self._error = error


class _Lane:
    """One FIFO of an `Uploads` and its thread; counts what it was handed and what ran."""

    def __init__(self, name: str, on_error: Callable[[BaseException], None]):
        self._name = name
        self._on_error = on_error
        self._queue: "queue.Queue[Callable[[], None]]" = queue.Queue()
        self._thread: Optional[threading.Thread] = None
        self._ran = threading.Condition()
        self.submitted = 0
        self.done = 0

    def submit(self, task: Callable[[], None]) -> None:
        with self._ran:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self.submitted += 1
            self._queue.put(task)

    def wait_for(self, mark: int) -> None:
        with self._ran:
            self._ran.wait_for(lambda: self.done >= mark)

    def _run(self) -> None:
        while True:
            task = self._queue.get()
            try:
                task()
            except BaseException as error:  # Raised on the caller's thread.
                self._on_error(error)
            finally:
                with self._ran:
                    self.done += 1
                    self._ran.notify_all()


_UPLOADS = Uploads()


def uploads() -> Uploads:
    """The process's uploads (one thread per lane, so that each lane lands in the order submitted)."""
    return _UPLOADS
