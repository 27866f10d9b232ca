"""ctl and orbit's runner protocol, both ways (BUILD.md, "orbit"): ctl's Controller drives
orbit's own `StandardTrainer`/`StandardEvaluator`; orbit's Controller drives ctl's Trainer as it
is (its `train` returns a `TrainLoopEnd`: a dict of the loop's results, which orbit's Controller
adds its rate to), with TensorFlow's checkpoint manager; and ctl's Controller's arguments:
orbit's familiar ones, the rest in three groups, each named in its errors. orbit's own tests of
its Controller run against ctl's in tests/test_orbit_controller_tests.py."""

import os

import keras
import orbit
import pytest
import tensorflow as tf

import ctl
from ctl.core.controller import Controller, Summaries
from ctl.core.summaries import SummaryManager
from tests.support.reading import scalars
from tests.tasks import RegressionTask, regression_data


class PlainOrbitRunner(orbit.StandardTrainer, orbit.StandardEvaluator):
    """Linear regression written against orbit alone: no ctl class."""

    def __init__(self):
        self.global_step = orbit.utils.create_global_step()
        self.model = keras.Sequential([keras.Input((3,)),
                                       keras.layers.Dense(1, kernel_initializer="zeros")])
        self.optimizer = keras.optimizers.SGD(0.1)
        self.train_loss, self.eval_loss = keras.metrics.Mean(), keras.metrics.Mean()
        train = tf.data.Dataset.from_tensor_slices(regression_data(64)).repeat().batch(8)
        evals = tf.data.Dataset.from_tensor_slices(regression_data(10, seed=1)).batch(5)
        orbit.StandardTrainer.__init__(self, train)
        orbit.StandardEvaluator.__init__(self, evals)

    def _loss(self, iterator):
        features, labels = next(iterator)
        return tf.reduce_mean(tf.square(labels - self.model(features)))

    def train_loop_begin(self):
        self.train_loss.reset_state()

    def train_step(self, iterator):
        with tf.GradientTape() as tape:
            loss = self._loss(iterator)
        variables = self.model.trainable_variables
        self.optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        self.train_loss.update_state(loss)
        self.global_step.assign_add(1)

    def train_loop_end(self):
        return {"loss": self.train_loss.result()}

    def eval_begin(self):
        self.eval_loss.reset_state()

    def eval_step(self, iterator):
        self.eval_loss.update_state(self._loss(iterator))

    def eval_end(self):
        return {"loss": self.eval_loss.result()}


def assert_trained_and_evaluated(summary_dir, output):
    evals = scalars(str(summary_dir / "eval"))["loss"]
    assert sorted(evals) == [10, 20, 30] and evals[30] < 0.5 * evals[10]
    assert sorted(scalars(str(summary_dir / "train"))["loss"]) == [10, 20, 30]
    assert float(output["loss"]) == pytest.approx(evals[30])


def test_ctls_controller_drives_orbits_standard_trainer_and_evaluator(tmp_path):
    runner = PlainOrbitRunner()
    controller = Controller(
        global_step=runner.global_step, trainer=runner, evaluator=runner, steps_per_loop=10,
        summaries=Summaries(train=SummaryManager(str(tmp_path / "train"), runner.global_step),
                            eval=SummaryManager(str(tmp_path / "eval"), runner.global_step)))
    output = controller.train_and_evaluate(train_steps=30, eval_steps=-1, eval_interval=10)
    controller.flush_summaries()
    assert controller.step == int(runner.global_step.numpy()) == 30
    assert_trained_and_evaluated(tmp_path, output)


def orbit_controller(trainer, model_dir, **kwargs):
    """orbit's own Controller over ctl's Trainer, checkpoints every 10 steps in `model_dir`."""
    manager = tf.train.CheckpointManager(trainer.checkpoint, str(model_dir), max_to_keep=None,
                                         step_counter=trainer.global_step, checkpoint_interval=10)
    return orbit.Controller(trainer=trainer, evaluator=trainer, global_step=trainer.global_step,
                            steps_per_loop=10, checkpoint_manager=manager, **kwargs)


def test_orbits_controller_drives_ctls_trainer(tmp_path):
    trainer = ctl.Trainer(RegressionTask())
    seen = []  # What orbit's Controller hands its train actions: ctl's loop results.
    controller = orbit_controller(trainer, tmp_path / "model", summary_dir=str(tmp_path / "train"),
                                  eval_summary_dir=str(tmp_path / "eval"),
                                  train_actions=[seen.append])
    controller.train_and_evaluate(train_steps=30, eval_steps=-1, eval_interval=10)
    assert int(trainer.global_step.numpy()) == 30
    assert [(end.step, sorted(end)) for end in seen] == [
        (step, ["learning_rate", "loss", "mae"]) for step in (10, 20, 30)]
    assert sorted(scalars(str(tmp_path / "train"))["steps_per_second"]) == [10, 20, 30]
    output = controller.evaluate(steps=-1)
    assert_trained_and_evaluated(tmp_path, output)
    assert [os.path.basename(path) for path in controller.checkpoint_manager.checkpoints] == [
        "ckpt-10", "ckpt-20", "ckpt-30"]
    # A new Trainer under a new orbit Controller restores step 30's model, and evaluates it so.
    restored = ctl.Trainer(RegressionTask())
    again = orbit_controller(restored, tmp_path / "model")
    assert int(restored.global_step.numpy()) == 30
    assert float(again.evaluate(steps=-1)["loss"]) == pytest.approx(float(output["loss"]))
    again.train(steps=40)  # Trains on from there, and saves at 40.
    assert int(restored.global_step.numpy()) == 40
    assert os.path.basename(again.checkpoint_manager.latest_checkpoint) == "ckpt-40"


def test_a_bad_controller_argument_names_itself_its_value_and_the_fix():
    runner = PlainOrbitRunner()
    given = dict(global_step=runner.global_step, trainer=runner, evaluator=runner)
    with pytest.raises(ValueError, match=r"`steps_per_loop` \(0\) must be a positive integer"):
        Controller(**given, steps_per_loop=0)
    with pytest.raises(ValueError, match=r"`summaries.interval` \(15\) must be a positive "
                                         r"multiple of `steps_per_loop` \(10\)"):
        Controller(**given, steps_per_loop=10, summaries=Summaries(interval=15))
    with pytest.raises(TypeError, match=r"`summaries` \(<ctl.core.summaries.SummaryManager .*\) "
                                        r"must be a ctl.core.controller.Summaries; wrap it: "
                                        r"summaries=Summaries\(...\)"):
        Controller(**given, steps_per_loop=10, summaries=SummaryManager(None, runner.global_step))
    with pytest.raises(ValueError, match=r"pass `checkpoints=Checkpoints\(manager=...\)` to "
                                         r"Controller\(\) before calling save_checkpoint\(\)"):
        Controller(**given, steps_per_loop=10).save_checkpoint()
