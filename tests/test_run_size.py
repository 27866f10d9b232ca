"""Restart at a new size: default <-> mirrored replicas, in-process (2 workers -> 1 -> 2: tests/test_cluster_faults.py).

The train set is read in a fixed order (RegressionTask, no shuffle) and each
example's features are unique, so the first batch after a resume says which
example the input continues at.
"""

import logging

import numpy as np
import tensorflow as tf

import ctl
from ctl import train_lib
from ctl.faults import run_size
from ctl.core.stop import SignalWatcher
from tests.support.strategies import mirrored
from ctl.model_dir import ModelDir
from ctl.cluster.run_plan import RunPlan
from tests.tasks import RegressionTask, regression_data

EXAMPLES = 64  # 8 global batches of 8 per epoch.
NEW_SIZE = "at a new size"


def _experiment(train_steps):
    schedule = ctl.Schedule(train_steps=train_steps, steps_per_loop=5, checkpoint_interval=5,
                            eval_interval=None)
    return ctl.Experiment(task=RegressionTask(train_examples=EXAMPLES), schedule=schedule)


def _train(model_dir, steps, strategy):
    ctl.run_experiment("train", model_dir, strategy, _experiment(steps))


def _next_examples(model_dir, strategy, caplog):
    """The example indices of the first step after resuming `model_dir`, and the new-size WARNINGs."""
    caplog.clear()
    with caplog.at_level(logging.WARNING), SignalWatcher() as watcher:
        built = train_lib.build_controller(RunPlan("train"), ModelDir(model_dir), strategy, _experiment(10**6),
                                           watcher=watcher)
        built.faults.resume_inputs()
    features, _ = next(built.trainer.train_iterator)
    batch = np.concatenate([f.numpy() for f in strategy.experimental_local_results(features)])
    table = regression_data(EXAMPLES)[0]
    indices = [int(np.flatnonzero((table == row).all(axis=1))[0]) for row in batch]
    warnings = [r.getMessage() for r in caplog.records if NEW_SIZE in r.getMessage()]
    return indices, warnings, built.trainer.checkpoint


def test_default_to_mirrored_and_back_continues_at_the_example_consumed(tmp_path, caplog):
    model_dir = str(tmp_path)
    _train(model_dir, 5, tf.distribute.get_strategy())  # 40 examples.
    indices, warnings, _ = _next_examples(model_dir, tf.distribute.get_strategy(), caplog)
    assert indices == list(range(40, 48)) and warnings == []  # Same size: no warning.

    # Two replicas of 4 examples each: the step after 40 examples reads examples 40..47.
    indices, warnings, _ = _next_examples(model_dir, mirrored(), caplog)
    assert indices == list(range(40, 48))
    assert len(warnings) == 1 and "ckpt-5" in warnings[0] and "1 replica(s)" in warnings[0]
    assert "2 replica(s)" in warnings[0] and "no longer bit-identical" in warnings[0]

    _train(model_dir, 10, mirrored())  # 5 more steps of 8 at 2 replicas: 80 examples.
    record = tf.train.load_variable(tf.train.latest_checkpoint(model_dir),
                                    run_size.TRAIN_EXAMPLES + "/.ATTRIBUTES/VARIABLE_VALUE")
    assert list(record) == [40, 5, 1, 2, 4]  # Since step 5: 2 replicas of 4.
    indices, warnings, _ = _next_examples(model_dir, mirrored(), caplog)
    assert indices == list(range(16, 24)) and warnings == []  # 80 mod 64; same size now.
    indices, warnings, _ = _next_examples(model_dir, tf.distribute.get_strategy(), caplog)
    assert indices == list(range(16, 24)) and len(warnings) == 1


class FixedReplicaBatchTask(RegressionTask):
    """Batches of `batch_size` per replica: the global batch grows with the replicas."""

    def build_inputs(self, training, input_context=None):
        features, targets = regression_data(self.train_examples if training else self.eval_examples)
        dataset = tf.data.Dataset.from_tensor_slices((features, targets))
        return dataset.repeat().batch(self.batch_size, drop_remainder=True)


def test_a_new_global_batch_resumes_at_the_example_not_the_step(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr("tests.test_run_size.RegressionTask", FixedReplicaBatchTask)
    model_dir = str(tmp_path)
    _train(model_dir, 5, tf.distribute.get_strategy())  # 5 steps of 8: 40 examples.
    # Two replicas of 8: step 6 reads examples 40..55 (skipping 5 steps' worth, 80, would be wrong).
    indices, warnings, _ = _next_examples(model_dir, mirrored(), caplog)
    assert indices == list(range(40, 56)) and len(warnings) == 1
    assert "global batch 8" in warnings[0] and "global batch 16" in warnings[0]
