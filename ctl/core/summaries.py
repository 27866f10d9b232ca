"""Loop summaries: built on the host, handed to TensorFlow once a second.

orbit's Controller writes the results of every train loop and evaluation
(loss, metrics, learning rate, steps/sec) through its `SummaryManager`, which
runs `tf.summary.scalar` eagerly once per value and flushes the writer each
time. Right after a train loop every eager op costs 0.1-0.2 ms on this CPU,
and orbit's way came to 0.6 ms a loop: 3% of a 100-step loop of a small model
(measured with `bench/`, figure 1).

ctl's `SummaryManager` keeps orbit's interface and what lands on disk (the same
tags, steps, float32 values and scalar plugin metadata that
`tf.summary.scalar` writes). `write_summaries` builds one `Summary` proto for a
flat dict of scalars on the host and keeps it with its step; `flush` hands
the kept protos to the writer (one `write_raw_pb` op each) and flushes it.
The controller flushes after each evaluation, before each checkpoint, at the
end of training, and otherwise at most once a second (`flush_if_due`), so a
checkpoint's steps always have their summaries on disk. Anything else (nested
dicts, which orbit writes to subdirectories, or a value that is not a real
scalar, which orbit rejects) takes orbit's path unchanged, after a flush.

Everything here runs eagerly, between loops.
"""

import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import orbit
import tensorflow as tf
from tensorboard.compat.proto import summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2
from tensorboard.plugins.scalar import metadata as scalar_metadata


class SummaryManager(orbit.utils.SummaryManager):
    """orbit's `SummaryManager` for `tf.summary.scalar`, buffered on the host."""

    FLUSH_SECONDS = 1.0

    def __init__(self, summary_dir: Optional[str], global_step: tf.Variable,
                 clock=time.monotonic):
        super().__init__(summary_dir, tf.summary.scalar, global_step=global_step)
        self._clock = clock
        self._pending: List[Tuple[int, bytes]] = []  # (step, serialized Summary)
        self._last_flush = clock()

    def write_summaries(self, summary_dict: Dict[str, Any], step: Optional[int] = None) -> None:
        """Keeps `summary_dict` for the next flush, at `step` (default: the global step's value)."""
        if not self._enabled:
            return
        summary = scalars_proto(summary_dict)
        if summary is None:
            self.flush()  # Keeps the order of the steps on disk.
            super().write_summaries(summary_dict)
            return
        if step is None:
            step = int(self._global_step.numpy())
        self._pending.append((step, summary.SerializeToString()))

    def flush(self) -> None:
        """Writes what `write_summaries` kept and flushes the writer to disk."""
        if not self._enabled:
            return
        self._last_flush = self._clock()
        if not self._pending:
            super().flush()
            return
        pending, self._pending = self._pending, []
        with self.summary_writer().as_default(), tf.summary.record_if(True):  # Flushes on exit.
            for step, proto in pending:
                tf.summary.experimental.write_raw_pb(proto, step=step)

    def flush_if_due(self) -> None:
        """Flushes if the last flush is `FLUSH_SECONDS` old."""
        if self._pending and self._clock() - self._last_flush >= self.FLUSH_SECONDS:
            self.flush()


def scalars_proto(values: Dict[str, Any]) -> Optional[summary_pb2.Summary]:
    """One `Summary` with a scalar summary per entry, or `None` if one is not a scalar.

    Each value is what `tf.summary.scalar` writes: a float32 scalar tensor
    with the scalar plugin's metadata.
    """
    if not values:
        return None
    summary = summary_pb2.Summary()
    for name, value in values.items():
        if isinstance(value, dict):
            return None
        array = np.asarray(value)
        if array.shape != () or array.dtype.kind not in "biuf":
            return None
        summary.value.add(tag=name, metadata=_SCALAR_METADATA).tensor.CopyFrom(
            tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, tensor_shape=_SCALAR_SHAPE,
                                   tensor_content=array.astype(np.float32).tobytes()))
    return summary


_SCALAR_METADATA = scalar_metadata.create_summary_metadata(display_name=None, description=None)
_SCALAR_SHAPE = tensor_shape_pb2.TensorShapeProto()
