"""Loop summaries: kept on the host, handed to TensorFlow every few seconds.

`SummaryManager` keeps the interface of orbit's (`summary_writer`, `write_summaries`, `flush`)
and what lands on disk (the same tags, steps and values `tf.summary.scalar` writes; a nested
dict's values in a subdirectory per key), but keeps a loop's scalars as Python floats and
writes all of a writer's kept rows with one `tf.function` call per flush. The controller
flushes before each checkpoint, at the end of training and otherwise every `FLUSH_SECONDS`
(the first rows kept at once: a run's first loop is on disk as it ends, as under orbit);
an evaluation's results are written as its `writing()` context ends. In an object store the
writers write to a local directory (`ctl.model_dir.staging`) and each flush hands an upload to
`ctl.model_dir.background` (`mirror`). Everything here runs eagerly, between loops.

`Summaries` is the Controller's argument that holds its two managers (train, eval) and the
interval of the train step's own `tf.summary` records.

Why, and what it saves: docs/explanation/training-loop.md ("Loop summaries").
"""

import contextlib
import dataclasses
import math
import os
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import tensorflow as tf
from tensorboard.plugins.scalar import metadata as scalar_metadata

from ctl.model_dir import staging
from ctl.model_dir.background import upload, uploads
from ctl.model_dir import eval_set_dir, is_object_store, uploaded_path
from ctl.model_dir.files import NewFiles


class SummaryManager:
    """Loop summaries of one directory (`None`: every call is a no-op), buffered on the host.

    Args:
        summary_dir: where the event files go, local or in an object store; None: every call is a no-op.
        global_step: the step variable, the default step of each record.
        clock: the time source of the flush interval (a test may pass its own).
    """

    FLUSH_SECONDS = 5.0

    def __init__(self, summary_dir: Optional[str], global_step: tf.Variable,
                 clock=time.monotonic):
        self.summary_dir = summary_dir
        self.enabled = summary_dir is not None
        self._global_step = global_step
        self._clock = clock
        self._writers: Dict[str, Any] = {}
        self._batch_writers: Dict[str, Callable] = {}  # Per subdirectory, traced on first use.
        self._pending: List[Tuple[str, int, Dict[str, float]]] = []  # (subdirectory, step, scalars)
        self._last_flush = -math.inf  # The first rows kept are due at once.
        # In an object store: written here, uploaded by `mirror`.
        self._local = (staging.directory("summaries")
                       if self.enabled and is_object_store(summary_dir) else None)
        self._uploaded: Dict[str, int] = {}  # Local file -> the size uploaded (uploads thread).
        self._mirror_queued = False  # One mirror waits at a time: it takes what is flushed by then.
        self._made: List[NewFiles] = []  # What creating each writer found (`discard`).
        self._hold = threading.Lock()
        self._held = False  # `hold`: no upload until `let_go`.
        self._held_back = False  # A mirror asked for while held.

    def summary_writer(self, relative_path: str = ""):
        """The writer of `relative_path` under the summary dir (a no-op writer if disabled).

        Args:
            relative_path: a subdirectory of the summary dir ("": the dir itself).
        """
        writer = self._writers.get(relative_path)
        if writer is None:
            directory = eval_set_dir(self._local or self.summary_dir, relative_path)
            if self.enabled:
                self._made.append(NewFiles(directory))
                writer = tf.summary.create_file_writer(directory)
            else:
                writer = tf.summary.create_noop_writer()
            self._writers[relative_path] = writer
        return writer

    def hold(self) -> None:
        """Uploads nothing until `let_go` (what is flushed meanwhile stays local): a run's
        summaries before it may write (a refused run's are removed by `discard`, never uploaded)."""
        with self._hold:
            self._held = True

    def let_go(self) -> None:
        """Ends `hold`: what was flushed meanwhile is uploaded."""
        with self._hold:
            self._held, held_back, self._held_back = False, self._held_back, False
        if held_back:
            self.mirror()

    def discard(self) -> None:
        """Closes the writers and removes what they made (their event files, and the directories
        they created): for a run refused before its first write, whose check traced its train
        loop under the writer."""
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()
        self._pending.clear()
        for made in reversed(self._made):
            made.undo()
        self._made.clear()

    def write_summaries(self, summary_dict: Dict[str, Any], step: Optional[int] = None) -> None:
        """Keeps `summary_dict` for the next flush, at `step` (default: the global step's value).

        A nested dict's values go to a subdirectory named by its key.

        Args:
            summary_dict: `{name: scalar}`, or `{subdirectory: {name: scalar}}`.
            step: the step recorded (default: the global step's value).
        """
        if not self.enabled:
            return
        if step is None:
            step = int(self._global_step.numpy())
        for relative_path, values in _by_directory(summary_dict).items():
            scalars = real_scalars(values)
            if scalars is not None:
                self.summary_writer(relative_path)  # Created now, written at the next flush.
                self._pending.append((relative_path, step, scalars))
                continue
            self.flush()  # Keeps the order of the steps on disk.
            with self.summary_writer(relative_path).as_default():
                for name, value in values.items():
                    tf.summary.scalar(name, value, step=step)  # Says what is wrong with it.

    def flush(self) -> None:
        """Writes what `write_summaries` kept and flushes the writers to disk."""
        if self.enabled:
            self._write_kept(flushed_on_exit=None)

    @contextlib.contextmanager
    def writing(self):
        """The summary dir's writer as the default for the block, then a `flush()`.

        `tf.summary` calls in the block (in a loop's steps) go to the summary
        dir. TensorFlow's writer context flushes its writer on exit: what
        `write_summaries` kept is written just before, so that one flush covers
        both (`with summary_writer().as_default()` and then `flush()` flush it
        twice, an eager call each).
        """
        if not self.enabled:
            yield
            return
        root = self.summary_writer()
        try:
            with root.as_default():  # Flushes on exit.
                try:
                    yield
                finally:
                    self._write_kept(flushed_on_exit="")
        finally:
            self.mirror()  # Also after an error: what was flushed is uploaded.

    @contextlib.contextmanager
    def tracing(self):
        """The summary dir's writer as the default for a trace that runs nothing (a check before
        the run's first write, `ctl.core.contract`): what it makes stays local, uploaded by
        the first flush after it (in an object store), or removed by `discard`."""
        if not self.enabled:
            yield
            return
        with self.summary_writer().as_default():
            yield

    def _write_kept(self, flushed_on_exit: Optional[str]) -> None:
        """Writes the kept rows, one call per writer that has some (which flushes it), and
        flushes the other writers but `flushed_on_exit` (inside its context, which flushes it)."""
        self._last_flush = self._clock()
        pending, self._pending = self._pending, []
        for relative_path, writer in list(self._writers.items()):
            rows = [(step, scalars) for path, step, scalars in pending if path == relative_path]
            if rows:
                self._batch_writer(relative_path)(*_flattened(rows))
            elif relative_path != flushed_on_exit:
                writer.flush()
        if flushed_on_exit is None:
            self.mirror()

    def close(self) -> None:
        """In an object store: flushes, waits for the uploads, then removes the local copy
        (also when an upload failed). A no-op elsewhere."""
        if self._local is None:
            return
        try:
            self.flush_kept()
            uploads().wait()
        finally:
            staging.remove(self._local)

    def mirror(self) -> None:
        """In an object store: queues the upload of what the writers flushed (a no-op elsewhere).

        Called after each flush of `flush()` and at the end of `writing()`.
        """
        if self._local is None:
            return
        with self._hold:
            if self._held:
                self._held_back = True
                return
        if not self._mirror_queued:
            self._mirror_queued = True
            uploads().submit(self._upload_grown, key=self._local)  # Beside other objects.

    def _upload_grown(self) -> None:
        self._mirror_queued = False  # A flush from now on queues the next mirror.
        for directory, _, names in tf.io.gfile.walk(self._local):
            for name in names:
                local = os.path.join(directory, name)
                size = os.path.getsize(local)
                if self._uploaded.get(local) != size:
                    remote = uploaded_path(local, self._local, self.summary_dir)
                    if local not in self._uploaded:  # Its directory, once.
                        tf.io.gfile.makedirs(os.path.dirname(remote))
                    upload(local, remote)
                    self._uploaded[local] = size

    @property
    def wrote(self) -> bool:
        """Whether its directory holds event files of this run (a writer was made there; in an
        object store, uploaded by the first flush or `writing()` after it)."""
        return self.enabled and bool(self._writers)

    @property
    def kept(self) -> int:
        """How many rows `write_summaries` kept since the last flush."""
        return len(self._pending)

    def flush_kept(self) -> None:
        """`flush()` if `write_summaries` kept anything since the last one (no eager op otherwise)."""
        if self._pending:
            self.flush()

    def flush_if_due(self) -> None:
        """Flushes if the last flush is `FLUSH_SECONDS` old."""
        if self._pending and self._clock() - self._last_flush >= self.FLUSH_SECONDS:
            self.flush()

    def _batch_writer(self, relative_path: str) -> Callable:
        """`write(tags, steps, values)`: one scalar summary per entry, then a flush; one call."""
        write = self._batch_writers.get(relative_path)
        if write is None:
            writer = self.summary_writer(relative_path)

            @tf.function(autograph=False, input_signature=[
                tf.TensorSpec([None], tf.string), tf.TensorSpec([None], tf.int64),
                tf.TensorSpec([None], tf.float32)])
            def write(tags, steps, values):
                with writer.as_default(), tf.summary.record_if(True):  # Flushes on exit.
                    def body(i):
                        tf.summary.write(tags[i], values[i], step=steps[i], metadata=_SCALAR_METADATA)
                        return (i + 1,)

                    tf.while_loop(lambda i: i < tf.size(tags), body, (tf.constant(0),))

            self._batch_writers[relative_path] = write
        return write


@dataclasses.dataclass(frozen=True)
class Summaries:
    """Where the Controller writes the loops' results, and how often the train step's own
    `tf.summary` calls record.

    Args:
        train: the train loops' summaries (None: nowhere).
        eval: the evaluations' summaries (None: nowhere).
        interval: steps between the train step's own `tf.summary` records, a multiple of
            `steps_per_loop`; None: never.
    """

    train: Optional[SummaryManager] = None
    eval: Optional[SummaryManager] = None
    interval: Optional[int] = None


def _by_directory(values: Dict[str, Any], relative_path: str = "") -> Dict[str, Dict[str, Any]]:
    """`values` split by subdirectory: a nested dict's entries go to one named by its key."""
    found: Dict[str, Dict[str, Any]] = {}
    for name, value in values.items():
        if isinstance(value, dict):
            for path, nested in _by_directory(value, os.path.join(relative_path, name)).items():
                found.setdefault(path, {}).update(nested)
        else:
            found.setdefault(relative_path, {})[name] = value
    return found


def real_scalars(values: Dict[str, Any]) -> Optional[Dict[str, float]]:
    """`values` as Python floats, or `None` if one is not a real scalar (or there are none).

    Args:
        values: `{name: value}`.
    """
    if not values:
        return None
    scalars = {}
    for name, value in values.items():
        if isinstance(value, (float, int, np.floating, np.integer)):  # A loop's results.
            scalars[name] = float(value)
            continue
        array = np.asarray(value)
        if array.shape != () or array.dtype.kind not in "biuf":
            return None
        scalars[name] = float(array)
    return scalars


def _flattened(rows: List[Tuple[int, Dict[str, float]]]):
    """`rows` of (step, scalars) as three flat arrays, one entry per value: tags, steps, values."""
    tags = [name for _, scalars in rows for name in scalars]
    steps = [step for step, scalars in rows for _ in scalars]
    values = [value for _, scalars in rows for value in scalars.values()]
    return (np.array(tags, dtype=object), np.array(steps, np.int64), np.array(values, np.float32))


_SCALAR_METADATA = scalar_metadata.create_summary_metadata(display_name=None, description=None)

