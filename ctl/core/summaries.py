"""Loop summaries: built on the host, handed to TensorFlow once a second.

orbit's Controller writes the results of every train loop and evaluation
(loss, metrics, learning rate, steps/sec) through its `SummaryManager`, which
runs `tf.summary.scalar` eagerly once per value and flushes the writer each
time. Right after a train loop every eager op costs 0.1-0.2 ms on this CPU,
and orbit's way came to 0.6 ms a loop: 3% of a 100-step loop of a small model
(measured with `bench/`, figure 1).

ctl's `SummaryManager` keeps the interface of orbit's (`summary_writer`,
`write_summaries`, `flush`) and what lands on disk (the same tags, steps,
float32 values and scalar plugin metadata that `tf.summary.scalar` writes, a
nested dict's values in a subdirectory per key, as for named eval sets), and
is ctl's own: no orbit class to keep in step with. `write_summaries` builds
one `Summary` proto per directory on the host and keeps it with its step;
`flush` hands the kept protos to the writers (one `write_raw_pb` op each) and
flushes them. The controller flushes after each evaluation, before each
checkpoint, at the end of training, and otherwise at most once a second
(`flush_if_due`), so a checkpoint's steps always have their summaries on
disk. A value that is not a real scalar goes to `tf.summary.scalar`, after a
flush, which rejects it as orbit's would.

Everything here runs eagerly, between loops.
"""

import os
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import tensorflow as tf
from tensorboard.compat.proto import summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2
from tensorboard.plugins.scalar import metadata as scalar_metadata


class SummaryManager:
    """Loop summaries of one directory (`None`: every call is a no-op), buffered on the host."""

    FLUSH_SECONDS = 1.0

    def __init__(self, summary_dir: Optional[str], global_step: tf.Variable,
                 clock=time.monotonic):
        self.summary_dir = summary_dir
        self.enabled = summary_dir is not None
        self._global_step = global_step
        self._clock = clock
        self._writers: Dict[str, Any] = {}
        self._pending: List[Tuple[str, int, bytes]] = []  # (subdirectory, step, serialized Summary)
        self._last_flush = clock()

    def summary_writer(self, relative_path: str = ""):
        """The writer of `relative_path` under the summary dir (a no-op writer if disabled)."""
        writer = self._writers.get(relative_path)
        if writer is None:
            writer = (tf.summary.create_file_writer(os.path.join(self.summary_dir, relative_path))
                      if self.enabled else tf.summary.create_noop_writer())
            self._writers[relative_path] = writer
        return writer

    def write_summaries(self, summary_dict: Dict[str, Any], step: Optional[int] = None) -> None:
        """Keeps `summary_dict` for the next flush, at `step` (default: the global step's value).

        A nested dict's values go to a subdirectory named by its key.
        """
        if not self.enabled:
            return
        if step is None:
            step = int(self._global_step.numpy())
        for relative_path, values in _by_directory(summary_dict).items():
            summary = scalars_proto(values)
            if summary is not None:
                self.summary_writer(relative_path)  # Created now, written at the next flush.
                self._pending.append((relative_path, step, summary.SerializeToString()))
                continue
            self.flush()  # Keeps the order of the steps on disk.
            with self.summary_writer(relative_path).as_default():
                for name, value in values.items():
                    tf.summary.scalar(name, value, step=step)  # Says what is wrong with it.

    def flush(self) -> None:
        """Writes what `write_summaries` kept and flushes the writers to disk."""
        if not self.enabled:
            return
        self._last_flush = self._clock()
        pending, self._pending = self._pending, []
        for relative_path, writer in list(self._writers.items()):
            with writer.as_default(), tf.summary.record_if(True):  # Flushes on exit.
                for path, step, proto in pending:
                    if path == relative_path:
                        tf.summary.experimental.write_raw_pb(proto, step=step)

    def flush_if_due(self) -> None:
        """Flushes if the last flush is `FLUSH_SECONDS` old."""
        if self._pending and self._clock() - self._last_flush >= self.FLUSH_SECONDS:
            self.flush()


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


def scalars_proto(values: Dict[str, Any]) -> Optional[summary_pb2.Summary]:
    """One `Summary` with a scalar summary per entry, or `None` if one is not a scalar.

    Each value is what `tf.summary.scalar` writes: a float32 scalar tensor
    with the scalar plugin's metadata.
    """
    if not values:
        return None
    summary = summary_pb2.Summary()
    for name, value in values.items():
        array = np.asarray(value)
        if array.shape != () or array.dtype.kind not in "biuf":
            return None
        summary.value.add(tag=name, metadata=_SCALAR_METADATA).tensor.CopyFrom(
            tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, tensor_shape=_SCALAR_SHAPE,
                                   tensor_content=array.astype(np.float32).tobytes()))
    return summary


_SCALAR_METADATA = scalar_metadata.create_summary_metadata(display_name=None, description=None)
_SCALAR_SHAPE = tensor_shape_pb2.TensorShapeProto()
