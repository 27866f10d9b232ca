"""ctl's batched loop summaries write what orbit's SummaryManager writes."""

import glob
import os

import numpy as np
import orbit
import pytest
import tensorflow as tf

from ctl.summaries import SummaryManager


def _events(directory):
    """(tag, step, value, plugin, dtype) for every summary value under `directory`."""
    found = []
    for path in sorted(glob.glob(os.path.join(directory, "**", "events.out.tfevents.*"),
                                 recursive=True)):
        sub = os.path.relpath(os.path.dirname(path), directory)
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                found.append((sub, value.tag, event.step, float(tf.make_ndarray(value.tensor)),
                              value.metadata.plugin_data.plugin_name, value.tensor.dtype))
    return sorted(found)


LOGS = [
    {"loss": np.float32(0.25), "accuracy": np.float64(0.5), "examples": 7, "ok": True,
     "steps_per_second": 1234.5},
    {"loss": np.float32(0.125), "accuracy": np.float64(0.75), "examples": 9, "ok": False,
     "steps_per_second": 99.0},
    {"by_set": {"a": np.float32(1.0)}, "loss": 3.0},  # Nested: orbit's path.
]


def test_writes_the_same_summaries_as_orbit(tmp_path):
    step = tf.Variable(0, dtype=tf.int64)
    ours = SummaryManager(str(tmp_path / "ctl"), step)
    theirs = orbit.utils.SummaryManager(str(tmp_path / "orbit"), tf.summary.scalar,
                                        global_step=step)
    for logs in LOGS:
        step.assign_add(10)
        for manager in (ours, theirs):
            manager.write_summaries(logs)
            manager.flush()
    written = _events(str(tmp_path / "ctl"))
    assert written == _events(str(tmp_path / "orbit"))
    assert ("by_set", "a", 30, 1.0, "scalars", tf.float32.as_datatype_enum) in written
    assert len(written) == 5 + 5 + 2


def test_keeps_summaries_until_a_flush_is_due(tmp_path):
    now = [0.0]
    step = tf.Variable(5, dtype=tf.int64)
    manager = SummaryManager(str(tmp_path), step, clock=lambda: now[0])
    manager.write_summaries({"loss": 1.0})
    manager.write_summaries({"loss": 2.0}, step=6)
    now[0] += SummaryManager.FLUSH_SECONDS / 2
    manager.flush_if_due()
    assert _events(str(tmp_path)) == []  # Nothing on disk yet.
    now[0] += SummaryManager.FLUSH_SECONDS
    manager.flush_if_due()
    assert [e[1:4] for e in _events(str(tmp_path))] == [("loss", 5, 1.0), ("loss", 6, 2.0)]
    SummaryManager(None, step).write_summaries({"loss": 1.0})  # No dir: writes nothing.


def test_a_nested_dict_is_written_after_what_was_kept(tmp_path):
    step = tf.Variable(1, dtype=tf.int64)
    manager = SummaryManager(str(tmp_path), step)
    manager.write_summaries({"loss": 1.0})
    step.assign(2)
    manager.write_summaries({"by_set": {"a": 3.0}})  # orbit's path: flushes first.
    manager.flush()
    assert [e[:4] for e in _events(str(tmp_path))] == [(".", "loss", 1, 1.0),
                                                         ("by_set", "a", 2, 3.0)]


def test_rejects_a_non_scalar_like_orbit(tmp_path):
    manager = SummaryManager(str(tmp_path), tf.Variable(0, dtype=tf.int64))
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError)):
        manager.write_summaries({"loss": np.zeros(3, np.float32)})
