"""Checkpoint intervals (pure logic) and validated restores."""

import pytest
import tensorflow as tf

import ctl
from ctl.core.checkpointing import CheckpointManager, interval_crossed
from ctl.model_dir import ModelDir


@pytest.mark.parametrize("last, step, expected", [
    (None, 100, False), (None, 500, True), (0, 499, False), (0, 500, True),
    (500, 900, False), (500, 1000, True), (400, 1100, True),  # Loops that jump a multiple.
    (1000, 1000, False),
])
def test_interval_crossed_fires_on_multiples_of_the_interval(last, step, expected):
    assert interval_crossed(500, last, step) is expected


def test_manager_saves_on_multiples_and_resumes_the_count(tmp_path):
    step = tf.Variable(0, dtype=tf.int64)
    checkpoint = tf.train.Checkpoint(step=step)

    def manager():
        return CheckpointManager(checkpoint, ModelDir(str(tmp_path)), max_to_keep=10, step_counter=step,
                                 checkpoint_interval=500)

    first = manager()
    saved = []
    for value in range(100, 1300, 300):  # Steps 100, 400, 700, 1000
        step.assign(value)
        saved.append(first.save() is not None)
    assert saved == [False, False, True, True]
    step.assign(1200)
    assert manager().save() is None  # A new manager knows 1000 was the last save.
    step.assign(1500)
    assert manager().save().endswith("ckpt-1500")


def test_restore_refuses_a_checkpoint_of_another_model(tmp_path):
    tf.train.Checkpoint(w=tf.Variable(tf.zeros((3, 1)))).save(str(tmp_path / "ckpt"))
    other = tf.train.Checkpoint(w=tf.Variable(tf.zeros((4, 1))))
    with pytest.raises(ctl.UserError, match="checkpoint of a different model"):
        CheckpointManager(other, ModelDir(str(tmp_path)), max_to_keep=1,
                          step_counter=tf.Variable(0)).restore_or_initialize()
