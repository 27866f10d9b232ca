"""The Trainer's loops through the public API: strategies, loop kinds, Keras flavors."""

import threading

import numpy as np
import pytest
import tensorflow as tf

import ctl
from ctl.core.trainer import Trainer
from tests.support.strategies import mirrored
from tests.tasks import FLAVORS, TRUE_WEIGHTS, PredictionsTask, RegressionTask, regression_data


def train_weights(strategy, task, steps=20, use_tf_while_loop=True, steps_per_loop=5):
    trainer = Trainer(task, strategy=strategy, use_tf_while_loop=use_tf_while_loop)
    ends = [trainer.train(tf.constant(steps_per_loop)) for _ in range(steps // steps_per_loop)]
    assert [end.step for end in ends] == list(range(steps_per_loop, steps + 1, steps_per_loop))
    assert all(end.bad_step is None and end.restored is None for end in ends)
    return trainer, ends[-1].logs, trainer.model.get_weights()[0]


@pytest.mark.parametrize("flavor", sorted(FLAVORS))
@pytest.mark.parametrize("use_tf_while_loop", [True, False], ids=["while_loop", "host_loop"])
def test_training_learns_and_counts_steps(strategy, flavor, use_tf_while_loop):
    task = RegressionTask(flavor)
    trainer, logs, weights = train_weights(strategy, task, use_tf_while_loop=use_tf_while_loop)
    assert int(trainer.global_step.numpy()) == 20  # Each loop's end step: train_weights.
    np.testing.assert_allclose(weights, TRUE_WEIGHTS, atol=0.15)
    assert set(logs) == {"loss", "mae", "learning_rate"}
    assert float(logs["learning_rate"]) == pytest.approx(0.1)
    assert float(logs["loss"]) < 0.1


@pytest.mark.parametrize("flavor", sorted(FLAVORS))
def test_mirrored_replicas_match_one_device(flavor):
    """Two replicas, each with half of the global batch, make the same updates."""
    _, _, single = train_weights(tf.distribute.get_strategy(), RegressionTask(flavor))
    _, _, replicated = train_weights(mirrored(), RegressionTask(flavor))
    np.testing.assert_allclose(replicated, single, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("use_tf_while_loop", [True, False], ids=["while_loop", "host_loop"])
def test_eval_sees_the_whole_eval_set_once(strategy, use_tf_while_loop):
    # 10 examples in batches of 8: the remainder batch of 2 must be evaluated too.
    trainer = Trainer(RegressionTask(eval_examples=10), strategy=strategy,
                      use_tf_while_loop=use_tf_while_loop)
    logs = trainer.evaluate(tf.constant(-1))
    assert float(logs["examples"]) == 10
    # Zero-initialized model: the loss is the mean squared target over all 10.
    _, targets = regression_data(10, seed=1)
    assert float(logs["loss"]) == pytest.approx(float(np.mean(targets**2)), rel=1e-5)
    # A fixed number of steps reads that many batches, from the start each time.
    assert float(trainer.evaluate(tf.constant(1))["examples"]) == 8
    assert float(trainer.evaluate(tf.constant(1))["examples"]) == 8


@pytest.mark.parametrize("use_tf_while_loop", [True, False], ids=["while_loop", "host_loop"])
def test_an_evaluation_longer_than_its_eval_set_ends_at_the_end_of_the_set(strategy,
                                                                         use_tf_while_loop):
    # 10 examples in batches of 8 are 2 batches; 5 asked for (Model Garden's validation_steps,
    # ctl.Schedule.eval_steps). orbit's loops and Model Garden's trainer end at the end of the
    # data with the results over what they read: so does either of ctl's loops.
    trainer = Trainer(RegressionTask(eval_examples=10), strategy=strategy,
                      use_tf_while_loop=use_tf_while_loop)
    whole = trainer.evaluate(tf.constant(-1))
    assert (whole.steps, whole.steps_asked, whole.data_ended) == (2, None, False)
    for _ in range(2):  # Each from the start of the set; the loop ended cleanly the first time.
        logs = trainer.evaluate(tf.constant(5))
        assert float(logs["examples"]) == 10
        assert float(logs["loss"]) == pytest.approx(float(whole["loss"]), rel=1e-6)
        assert (logs.steps, logs.steps_asked, logs.data_ended) == (2, 5, True)
    exact = trainer.evaluate(tf.constant(2))
    assert (exact.steps, exact.data_ended, float(exact["examples"])) == (2, False, 10)
    # A task that aggregates on the host (its own loop) ends there too, with every prediction.
    aggregating = Trainer(PredictionsTask(eval_examples=10), strategy=strategy,
                          use_tf_while_loop=use_tf_while_loop)
    logs = aggregating.evaluate(tf.constant(5))
    assert logs["predicted_examples"] == 10 and (logs.steps, logs.data_ended) == (2, True)


def test_aggregate_logs_gets_every_prediction(strategy):
    trainer = Trainer(PredictionsTask(eval_examples=10), strategy=strategy)
    logs = trainer.evaluate(tf.constant(-1))
    assert logs["predicted_examples"] == 10
    assert logs["mean_prediction"] == pytest.approx(0.0)  # Zero-initialized kernel.


def test_hooks_can_be_overridden(tmp_path):
    """A Trainer subclass sees every input through next_train_inputs."""

    class CountingTrainer(Trainer):
        def train_loop_begin(self):
            super().train_loop_begin()
            self.loops = getattr(self, "loops", 0) + 1

        def next_train_inputs(self, iterator):
            features, targets = next(iterator)
            return features, targets * 0.0  # Teach the model to predict zero.

    built = []

    class Recorded(CountingTrainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            built.append(self)

    experiment = ctl.Experiment(
        task=RegressionTask(), trainer_cls=Recorded,
        schedule=ctl.Schedule(train_steps=30, steps_per_loop=10, eval_interval=None),
    )
    results = ctl.run_experiment("train_and_eval", str(tmp_path), experiment=experiment)
    assert [trainer.loops for trainer in built] == [3]  # train_loop_begin: once a loop.
    assert results["examples"] == 10
    assert results["loss"] > 1.0  # Trained on zeros, evaluated on the real targets.


def test_build_model_without_variables_is_a_user_error():
    class Unbuilt(RegressionTask):
        def build_model(self):
            return self.k.Sequential([self.k.layers.Dense(1)])

    with pytest.raises(ctl.UserError, match="without variables"):
        Trainer(Unbuilt())


def test_initialize_runs_only_when_the_model_dir_has_no_checkpoint(tmp_path):
    """One warm-start route: the hooks' `on_initialize`, then the task's `initialize`, once."""
    calls = []

    class Pretrained(RegressionTask):
        def initialize(self, model):
            calls.append("task")
            model.layers[-1].kernel.assign(TRUE_WEIGHTS)

    class Initializer(ctl.hooks.Hook):
        def on_initialize(self):
            calls.append("hook")

    def run(steps):
        experiment = ctl.Experiment(task=Pretrained(), hooks=[Initializer()], schedule=ctl.Schedule(
            train_steps=steps, steps_per_loop=5, eval_interval=None))
        return ctl.run_experiment("train_and_eval", str(tmp_path), experiment=experiment)

    assert run(0)["loss"] == pytest.approx(0.0, abs=1e-10)  # Pretrained weights are exact.
    assert run(5)["loss"] == pytest.approx(0.0, abs=1e-6)   # Restored, not initialized again.
    assert calls == ["hook", "task"]


def test_one_device_strategy_trains():
    strategy = tf.distribute.OneDeviceStrategy("/cpu:1")
    trainer, _, weights = train_weights(strategy, RegressionTask())
    assert "CPU:1" in trainer.global_step.device
    np.testing.assert_allclose(weights, TRUE_WEIGHTS, atol=0.15)


class EndsSlowlyTask(RegressionTask):
    """Its eval pipeline's batches after the first two wait for `release`, in a parallel map.

    One step reads one batch, or one per replica (two replicas at most here).
    Ending such an iterator waits for those calls, as ending any pipeline
    waits for its threads' work in flight.
    """

    def __init__(self, release: threading.Event):
        super().__init__(eval_examples=64)
        self.release = release

    def build_inputs(self, training, input_context=None):
        dataset = super().build_inputs(training, input_context)
        if training:
            return dataset

        def wait_after_two(index, features):
            if index >= 2:
                self.release.wait(timeout=300)  # A bound; the test sets it.
            return features

        def slow(index, batch):
            features, targets = batch
            waited = tf.py_function(wait_after_two, [index, features], tf.float32)
            return tf.ensure_shape(waited, features.shape), targets

        return dataset.enumerate().map(slow, num_parallel_calls=2).prefetch(1)


@pytest.mark.parametrize("use_tf_while_loop", [True, False], ids=["while_loop", "host_loop"])
def test_an_evaluation_does_not_wait_for_its_input_pipeline_to_end(strategy, use_tf_while_loop):
    """The finished eval iterator ends on another thread (`ctl.core.loops.end_off_path`)."""
    release = threading.Event()
    trainer = Trainer(EndsSlowlyTask(release), strategy=strategy,
                      use_tf_while_loop=use_tf_while_loop)
    returned = threading.Event()
    logs = {}

    def evaluate():
        logs.update(trainer.evaluate(tf.constant(1)))
        returned.set()

    thread = threading.Thread(target=evaluate, daemon=True)
    thread.start()
    try:
        assert returned.wait(timeout=60), "evaluate waited for its pipeline's work in flight"
    finally:
        release.set()
        thread.join(timeout=300)
    assert float(logs["examples"]) == 8
