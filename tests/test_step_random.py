"""`ctl.FaultTolerance.stateless_random_ops`: the train step's draws from `tf.random` as functions
of the step, so that a resumed run draws what the uninterrupted run drew.

In-process, real TensorFlow and model dirs: each `ctl.run_experiment` builds a new Trainer
whose functions' kernels start over, as a new process's do (the process tests of the zoo,
`bench.model_garden_zoo.guarantees`, kill real runs of Model Garden's models).
"""

import numpy as np
import pytest
import tensorflow as tf

import ctl
from tests.fault_tasks import ProbeTask
from tests.support.reading import checkpoint_values


class DrawingStepTask(ProbeTask):
    """Its train step draws from TensorFlow's stateful random ops, as Model Garden's models do
    (stochastic depth's `tf.random.uniform`, the R-CNNs' sampling by `tf.random.shuffle`): noise
    on the features, and half of the batch chosen at random."""

    def __init__(self):
        super().__init__(dropout=0)

    def train_step(self, inputs, model, optimizer, metrics):
        features, labels = inputs
        noise = tf.random.uniform(tf.shape(features), -0.5, 0.5) * tf.random.normal([])
        half = tf.shape(features)[0] // 2
        chosen = tf.random.shuffle(tf.range(tf.shape(features)[0]))[:half]
        return super().train_step((tf.gather(features + noise, chosen), tf.gather(labels, chosen)),
                                  model, optimizer, metrics)


def _train(model_dir, steps, strategy=None, **fault_tolerance):
    schedule = ctl.Schedule(train_steps=steps, steps_per_loop=2, checkpoint_interval=2,
                            eval_interval=None)
    ctl.run_experiment("train", str(model_dir), strategy=strategy, experiment=ctl.Experiment(
        task=DrawingStepTask(), schedule=schedule,
        fault_tolerance=ctl.FaultTolerance(**fault_tolerance)))
    values = checkpoint_values(tf.train.latest_checkpoint(str(model_dir)))
    return {name: value for name, value in values.items() if "_trainable_variables" in name}


def _resumed_equals_straight(tmp_path, strategy, **fault_tolerance) -> bool:
    straight = _train(tmp_path / "straight", 6, strategy, **fault_tolerance)
    _train(tmp_path / "resumed", 2, strategy, **fault_tolerance)
    resumed = _train(tmp_path / "resumed", 6, strategy, **fault_tolerance)
    assert straight.keys() == resumed.keys() and straight
    return all(np.array_equal(straight[name], resumed[name]) for name in straight)


def test_a_resumed_run_draws_what_the_uninterrupted_run_drew(tmp_path, strategy):
    # On the default strategy and on two replicas (each draws its own numbers).
    assert _resumed_equals_straight(tmp_path / "stateless", strategy, seed=7,
                                    stateless_random_ops=True)
    # TensorFlow's stateful ops start over in the resumed run: other noise, other halves.
    assert not _resumed_equals_straight(tmp_path / "stateful", strategy, seed=7)


def test_a_draw_depends_on_its_call_its_step_and_its_micro_batch_only():
    from ctl.core import step_random

    step = tf.Variable(0, dtype=tf.int64)

    @tf.function
    def draws(micro_batch):
        with step_random.drawn_per_step(7, step, micro_batch):
            return tf.random.uniform([4]), tf.random.uniform([4])

    first, second = draws(0)
    assert not np.array_equal(first, second)  # Two calls of one step.
    assert np.array_equal(draws(0)[0], first)  # Called again at the same step: the same.
    assert not np.array_equal(draws(1)[0], first)  # Another micro-batch.
    step.assign(1)
    assert not np.array_equal(draws(0)[0], first)  # Another step.


class PrintingDrawTask(ProbeTask):
    """Its train step prints one draw of `tf.random.uniform` per micro-batch to `draws_file`."""

    def __init__(self, draws_file):
        super().__init__(dropout=0)
        self.draws_file = draws_file

    def train_step(self, inputs, model, optimizer, metrics):
        tf.print(tf.random.uniform([]), output_stream=f"file://{self.draws_file}")
        return super().train_step(inputs, model, optimizer, metrics)


def test_each_micro_batch_of_a_step_draws_its_own_numbers(tmp_path):
    draws = tmp_path / "draws"
    schedule = ctl.Schedule(train_steps=2, steps_per_loop=2, eval_interval=None)
    ctl.run_experiment("train", str(tmp_path / "run"), experiment=ctl.Experiment(
        task=PrintingDrawTask(str(draws)), schedule=schedule,
        trainer_args={"accumulation_steps": 3},
        fault_tolerance=ctl.FaultTolerance(seed=7, stateless_random_ops=True)))
    values = draws.read_text().split()
    assert len(values) == 6 and len(set(values)) == 6, values  # 2 steps of 3 micro-batches.


def test_without_a_seed_it_is_one_line_naming_both_settings():
    with pytest.raises(ctl.UserError, match=r"stateless_random_ops=True draws from the run's "
                                            r"seed, and ctl.FaultTolerance.seed is not set"):
        ctl.FaultTolerance(stateless_random_ops=True)


def test_draws_outside_the_train_step_are_tensorflows_own():
    # The input pipeline and the eval step, on this thread or another, still draw from the
    # stateful ops: a trace outside the step holds them.
    from ctl.core import step_random

    with step_random.drawn_per_step(1, tf.Variable(0, dtype=tf.int64)):
        pass  # Replaces tf.random's functions once.
    traced = tf.function(lambda: tf.random.uniform([2]) + tf.cast(tf.random.shuffle(
        tf.range(3))[0], tf.float32)).get_concrete_function()
    ops = {op.type for op in traced.graph.get_operations()}
    assert {"RandomUniform", "RandomShuffle"} <= ops


def test_a_seeded_run_names_the_stateful_random_ops_its_train_step_draws_from(tmp_path, caplog):
    _train(tmp_path / "stateful", 2, seed=7)
    assert ("the train step draws from stateful random ops (RandomShuffle, RandomStandardNormal, "
            "RandomUniform)") in caplog.text
    caplog.clear()
    _train(tmp_path / "stateless", 2, seed=7, stateless_random_ops=True)
    assert "stateful random ops" not in caplog.text  # Each draw of the step reached.
