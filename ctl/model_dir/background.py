"""Writes to an object store off the training thread: in order, on threads of their own.

Checkpoints, summaries and `metrics.jsonl` are written locally (or kept in memory) and their
uploads handed to the process's `Uploads`:

    uploads().submit(upload, local, remote)   # returns at once
    ...
    uploads().wait()   # every upload submitted so far is done (or its error raised)

Four lanes (`FILES`, `CHECKPOINT_FILES`, `CHECKPOINTS`, `RETIREMENTS`), each on threads of its own:
first in, first out per object written (`submit`'s `key`), different objects side by side; the
first error is raised again on the caller's thread. On a file system nothing is
handed here. The lanes' order, and what the store's latency costs:
docs/explanation/model-dir-records.md.
"""

import threading
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

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
CHECKPOINT_FILES = "checkpoint_files"  # Checkpoints' files, while the one before is published.
CHECKPOINTS = "checkpoints"  # The state file naming each checkpoint, in the order saved.
RETIREMENTS = "retirements"  # Deletes of checkpoints the state file no longer names.
# Threads per lane: uploads of different objects (`submit`'s `key`) overlap on a lane with more
# than one; the state file and the retirements keep one, in the order handed over.
WORKERS = {FILES: 3, CHECKPOINT_FILES: 2, CHECKPOINTS: 1, RETIREMENTS: 1}


class Uploads:
    """Lanes of upload functions, each run on daemon threads of its own (started as needed):
    on a lane, what was handed over under one key runs in that order, one at a time, and what
    was handed over under different keys overlaps on its threads (`WORKERS`); lanes overlap.

    Args:
        name: the prefix of the lanes' thread names.
        lanes: the lanes' names (`FILES`, `CHECKPOINT_FILES`, `CHECKPOINTS`, `RETIREMENTS`).
        workers: threads per lane (`WORKERS`; a lane not named has one).
    """

    def __init__(self, name: str = "ctl-uploads",
                 lanes=(FILES, CHECKPOINT_FILES, CHECKPOINTS, RETIREMENTS),
                 workers: Optional[Dict[str, int]] = None):
        workers = WORKERS if workers is None else workers
        self._lanes = {lane: _Lane(f"{name}-{lane}", self._store, workers.get(lane, 1))
                       for lane in lanes}
        self._error: Optional[BaseException] = None
        self._lock = threading.Lock()

    def submit(self, fn: Callable, *args, lane: str = FILES, key: Optional[str] = None) -> None:
        """Queues `fn(*args)` on `lane`; raises the error of an earlier upload, if one failed.

        Args:
            fn: the upload function.
            lane: the lane it waits in.
            key: what it writes (an object, a directory): it runs after what `lane` was handed
                under the same key, and may run beside what it was handed under another
                (None: one key of its own for all such uploads of the lane).
            *args: its arguments.
        """
        self.check()
        self._lanes[lane].submit(lambda: fn(*args), key)

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
    """One lane of an `Uploads` and its threads; counts what it was handed and what ran. A task
    runs once no task of its key runs and none handed over before it under its key waits."""

    def __init__(self, name: str, on_error: Callable[[BaseException], None], workers: int = 1):
        self._name = name
        self._on_error = on_error
        self._workers = max(1, workers)
        self._threads: List[threading.Thread] = []
        self._idle = 0  # Threads waiting for a task.
        self._waiting: List[Tuple[int, Any, Callable[[], None]]] = []  # (number, key, task)
        self._running: Set[Any] = set()  # Keys whose task runs now.
        self._ran = threading.Condition()
        self._finished: Set[int] = set()  # Numbers done beyond `_below`.
        self._below = 0  # Every task numbered below this one ran.
        self.submitted = 0
        self.done = 0

    def submit(self, task: Callable[[], None], key: Any = None) -> None:
        with self._ran:
            number = self.submitted
            self.submitted += 1
            self._waiting.append((number, key, task))
            if self._idle < len(self._waiting) and len(self._threads) < self._workers:
                thread = threading.Thread(target=self._run, daemon=True,
                                          name=f"{self._name}-{len(self._threads)}"
                                          if self._threads else self._name)
                self._threads.append(thread)
                thread.start()
            self._ran.notify_all()

    def wait_for(self, mark: int) -> None:
        with self._ran:
            self._ran.wait_for(lambda: self._below >= mark)

    def _ready(self) -> Optional[int]:
        """The index in `_waiting` of the first task whose key has no task running or waiting
        before it (None: none)."""
        seen = set(self._running)
        for index, (_, key, _) in enumerate(self._waiting):
            if key not in seen:
                return index
            seen.add(key)
        return None

    def _run(self) -> None:
        while True:
            with self._ran:
                self._idle += 1
                self._ran.wait_for(lambda: self._ready() is not None)
                self._idle -= 1
                number, key, task = self._waiting.pop(self._ready())
                self._running.add(key)
            try:
                task()
            except BaseException as error:  # Raised on the caller's thread.
                self._on_error(error)
            finally:
                with self._ran:
                    self._running.discard(key)
                    self.done += 1
                    self._finished.add(number)
                    while self._below in self._finished:
                        self._finished.discard(self._below)
                        self._below += 1
                    self._ran.notify_all()


_UPLOADS = Uploads()


def uploads() -> Uploads:
    """The process's uploads (what each lane was handed under one key lands in that order)."""
    return _UPLOADS
