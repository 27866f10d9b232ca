"""The train-step settings of ctl.Trainer, checked against hand computations.

Mixed precision, XLA, clipping, accumulation, the moving average and
learning-rate schedules, for Keras 3 and tf_keras models, on the default
strategy and MirroredStrategy over two logical CPUs (tests/conftest.py).
"""

import gin
import keras
import numpy as np
import pytest
import tensorflow as tf

import ctl
from ctl.hooks.best import best_record
from ctl.core.trainer import Trainer
from ctl.core.stop import SignalWatcher
from ctl.core.runner import NO_BAD_STEP
from ctl.sidecar.continuous_eval import evaluate_continuously
from ctl.model_dir import ModelDir
from tests.sidecar_tasks import SlowRegressionTask
from tests.tasks import FLAVORS, LateHeadTask, RegressionTask, regression_data
from tests.support.reading import assert_bit_equal

FLAVOR_NAMES = sorted(FLAVORS)


def train(trainer, steps, steps_per_loop=1):
    logs = None
    for _ in range(steps // steps_per_loop):
        logs = trainer.train(tf.constant(steps_per_loop))
    return {name: np.asarray(value) for name, value in logs.logs.items()}


def weights(model):
    return [np.asarray(w) for w in model.get_weights()]


def first_batch(size):
    """The first `size` train examples of RegressionTask (read in a fixed order)."""
    features, targets = regression_data(64, seed=0)
    return features[:size].astype(np.float64), targets[:size].astype(np.float64)


def mse_gradient(features, targets, kernel, bias):
    """d/d(kernel, bias) of mean((targets - features @ kernel - bias)^2), in float64."""
    residual = targets - features @ kernel - bias
    return -2 * features.T @ residual / len(features), -2 * residual.sum(0) / len(features)


# Accumulation.


@pytest.mark.parametrize("flavor", FLAVOR_NAMES)
def test_accumulation_is_one_update_on_a_k_times_larger_batch(strategy, flavor):
    """4 micro-batches of 8 per update == batches of 32, with a schedule that decays per update."""
    schedules = FLAVORS[flavor].optimizers.schedules

    def task(batch_size):
        return RegressionTask(flavor, batch_size=batch_size,
                              learning_rate=schedules.ExponentialDecay(0.1, 1, 0.5))

    accumulated = Trainer(task(8), strategy=strategy, accumulation_steps=4)
    logs = train(accumulated, steps=3, steps_per_loop=3)
    big = Trainer(task(32), strategy=strategy)
    big_logs = train(big, steps=3, steps_per_loop=3)
    for a, b in zip(weights(accumulated.model), weights(big.model)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # One global step, one optimizer iteration and one schedule step per update.
    assert int(accumulated.global_step.numpy()) == 3
    assert int(accumulated.optimizer.iterations.numpy()) == 3
    # The summary is the optimizer's learning_rate: Keras 3 evaluates the schedule at
    # the current iteration (the next update's rate); tf_keras gives the last update's.
    expected = 0.1 * 0.5 ** (3 if flavor == "keras3" else 2)
    assert float(logs["learning_rate"]) == pytest.approx(expected)
    assert float(big_logs["learning_rate"]) == pytest.approx(expected)
    # The loop's loss is the mean over its 12 micro-batches: the big batches' mean.
    assert float(logs["loss"]) == pytest.approx(float(big_logs["loss"]), rel=1e-5)


def test_accumulation_reads_k_batches_per_step_on_resume(tmp_path):
    """A run resumed at step 2 with accumulation_steps=4 continues at batch 9, as one straight run."""
    gin.parse_config("ctl.Trainer.accumulation_steps = 4")

    def run(model_dir, steps):
        experiment = ctl.Experiment(task=RegressionTask(batch_size=8), schedule=ctl.Schedule(
            train_steps=steps, steps_per_loop=1, checkpoint_interval=1, eval_interval=None))
        ctl.run_experiment("train", str(model_dir), experiment=experiment)
        return tf.train.latest_checkpoint(str(model_dir))

    run(tmp_path / "resumed", 2)
    assert_bit_equal(run(tmp_path / "resumed", 5), run(tmp_path / "straight", 5))


# Clipping.


@pytest.mark.parametrize("flavor", FLAVOR_NAMES)
def test_clipping_scales_the_summed_gradient_to_clip_norm(strategy, flavor):
    """One SGD step from zero weights: the update is -lr * g * clip_norm / |g|, g over the global batch."""
    clip_norm, learning_rate = 0.5, 0.1
    trainer = Trainer(RegressionTask(flavor, learning_rate=learning_rate), strategy=strategy,
                      clip_norm=clip_norm)
    logs = train(trainer, steps=1)
    features, targets = first_batch(8)
    gradient = mse_gradient(features, targets, np.zeros((3, 1)), np.zeros(1))
    norm = np.sqrt(sum(np.sum(g**2) for g in gradient))
    assert norm > clip_norm  # The test clips.
    assert float(logs["gradient_norm"]) == pytest.approx(norm, rel=1e-5)
    kernel, bias = weights(trainer.model)
    np.testing.assert_allclose(kernel, -learning_rate * gradient[0] * clip_norm / norm, rtol=1e-5)
    np.testing.assert_allclose(bias, -learning_rate * gradient[1] * clip_norm / norm, rtol=1e-5)


# Moving average.


@pytest.mark.parametrize("flavor", FLAVOR_NAMES)
def test_moving_average_follows_the_formula_and_is_what_evaluation_uses(strategy, flavor):
    decay = 0.7
    trainer = Trainer(RegressionTask(flavor), strategy=strategy, ema_decay=decay)
    # Before any update the average is the weights themselves.
    features, targets = regression_data(10, seed=1)
    assert float(trainer.evaluate(tf.constant(-1))["loss"]) == pytest.approx(
        float(np.mean(targets**2)), rel=1e-5)
    expected = None
    for _ in range(4):
        train(trainer, steps=1)
        current = weights(trainer.model)
        expected = current if expected is None else [
            decay * e + (1 - decay) * w for e, w in zip(expected, current)]
    average = weights(trainer.ema.model)
    for a, e in zip(average, expected):
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-7)
    assert not np.allclose(average[0], weights(trainer.model)[0])  # A real average.
    kernel, bias = average
    loss = np.mean((targets - features @ kernel - bias) ** 2)
    assert float(trainer.evaluate(tf.constant(-1))["loss"]) == pytest.approx(loss, rel=1e-5)


def test_moving_average_reaches_the_sidecar_the_exports_and_the_best_checkpoint(tmp_path):
    """A run with ema_decay: its checkpoint, the sidecar, the exports and the best checkpoint
    all hold or use the average, not the trained weights."""
    gin.parse_config("ctl.Trainer.ema_decay = 0.8")
    model_dir = str(tmp_path)
    experiment = ctl.Experiment(
        task=RegressionTask(), hooks=[ctl.hooks.LatestExporter(), ctl.hooks.BestCheckpoint()],
        schedule=ctl.Schedule(train_steps=6, steps_per_loop=3, eval_interval=6,
                              checkpoint_interval=6))
    inline = ctl.run_experiment("train_and_eval", model_dir, experiment=experiment)
    restored = Trainer(RegressionTask(), evaluate=False)  # ema_decay from gin.
    restored.checkpoint.read(tf.train.latest_checkpoint(model_dir)).assert_existing_objects_matched()
    kernel, bias = weights(restored.ema.model)
    assert not np.allclose(kernel, weights(restored.model)[0])
    assert int(restored.ema.updates.numpy()) == 6
    # The exported model serves the average.
    features = regression_data(4, seed=3)[0]
    served = tf.saved_model.load(f"{model_dir}/export/latest/6").signatures["serving_default"]
    np.testing.assert_allclose(served(tf.constant(features))["outputs"].numpy(),
                               features @ kernel + bias, rtol=1e-5)
    # The best checkpoint's model is the average.
    best = RegressionTask().build_model()
    tf.train.Checkpoint(model=best).read(best_record(ModelDir(model_dir))["path"]).expect_partial()
    np.testing.assert_array_equal(weights(best)[0], kernel)
    # The sidecar evaluates the average: the in-line results, again.
    sidecar = evaluate_continuously(
        ModelDir(model_dir), experiment=experiment,
        settings=ctl.ContinuousEval(max_evaluations=1, timeout=60))
    assert sidecar["results"]["loss"] == pytest.approx(float(inline["loss"]), rel=1e-6)


# Mixed precision.


class _Overflowing(RegressionTask):
    """Multiplies the loss by `factor` (a variable the test sets): 1e30 is finite in float32
    but overflows the float16 gradients."""

    def __init__(self, flavor):
        super().__init__(flavor)
        self.factor = tf.Variable(1.0, trainable=False)

    def build_losses(self, labels, outputs, aux_losses=None):
        return super().build_losses(labels, outputs) * self.factor


@pytest.mark.parametrize("flavor", FLAVOR_NAMES)
def test_float16_overflow_skips_the_update_and_is_no_nan_stop(strategy, flavor):
    task = _Overflowing(flavor)
    trainer = Trainer(task, strategy=strategy, mixed_precision="mixed_float16",
                      stop=SignalWatcher())  # Never signalled: the watcher is not entered.
    assert trainer.model.layers[-1].compute_dtype == "float16"
    assert keras.mixed_precision.global_policy().name == "float32"  # Only while building.
    logs = train(trainer, steps=2)
    before, scale = weights(trainer.model), float(logs["loss_scale"])
    task.factor.assign(1e30)
    logs = train(trainer, steps=1)  # The overflow.
    for a, b in zip(weights(trainer.model), before):
        np.testing.assert_array_equal(a, b)  # Skipped.
    assert float(logs["loss_scale"]) == scale / 2
    assert np.isfinite(float(logs["loss"]))
    assert int(trainer.step_guard.bad_step.numpy()) == NO_BAD_STEP
    task.factor.assign(1.0)
    train(trainer, steps=1)
    assert not np.array_equal(weights(trainer.model)[0], before[0])  # Training goes on.
    reader_keys = {name for name, _ in tf.train.list_variables(_save(trainer, "ckpt"))}
    assert any("scale" in name and name.startswith("optimizer/") for name in reader_keys)


def _save(trainer, name):
    import tempfile  # noqa: PLC0415
    return trainer.checkpoint.write(f"{tempfile.mkdtemp()}/{name}")


@pytest.mark.parametrize("flavor", FLAVOR_NAMES)
def test_bfloat16_trains_and_evaluates_in_float32_outputs(strategy, flavor):
    trainer = Trainer(RegressionTask(flavor), strategy=strategy, mixed_precision="mixed_bfloat16")
    assert trainer.model.layers[-1].compute_dtype == "bfloat16"
    assert trainer.model.layers[-1].kernel.dtype == "float32"
    first = float(train(trainer, steps=2)["loss"])
    last = float(train(trainer, steps=10, steps_per_loop=10)["loss"])
    assert last < first / 2
    assert trainer.evaluate(tf.constant(-1))["loss"].dtype == tf.float32


class _StepWithoutScaling(RegressionTask):
    def train_step(self, inputs, model, optimizer, metrics):
        with tf.GradientTape() as tape:
            loss = self.build_losses(inputs[1], tf.cast(model(inputs[0]), tf.float32))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                      model.trainable_variables))
        return {"loss": loss}


def test_float16_refuses_a_custom_step_that_skips_the_loss_scale():
    trainer = Trainer(_StepWithoutScaling(), mixed_precision="mixed_float16")
    with pytest.raises(ctl.UserError, match=r"optimizer.scale_loss\(loss\)"):
        trainer.train(tf.constant(1))


# A model that applies its own update.


class _ModelAppliesItsUpdate(RegressionTask):
    """Compiles its model with the optimizer it returns; its step is Keras' `model.train_step`."""

    def build_model(self):
        self.model = super().build_model()
        self.model.compile(optimizer=self.k.optimizers.SGD(self.learning_rate), loss="mse")
        return self.model

    def build_optimizer(self):
        return self.model.optimizer

    def train_step(self, inputs, model, optimizer, metrics):
        return {"loss": model.train_step(inputs)["loss"]}


def test_a_model_compiled_with_the_optimizer_may_apply_its_update_itself(strategy):
    """One SGD step from zero weights, applied once (by the model): -lr * g over the global batch."""
    learning_rate = 0.1
    trainer = Trainer(_ModelAppliesItsUpdate("tf_keras", learning_rate=learning_rate),
                      strategy=strategy)
    train(trainer, steps=1)
    features, targets = first_batch(8)
    gradient = mse_gradient(features, targets, np.zeros((3, 1)), np.zeros(1))
    kernel, bias = weights(trainer.model)
    np.testing.assert_allclose(kernel, -learning_rate * gradient[0], rtol=1e-5)
    np.testing.assert_allclose(bias, -learning_rate * gradient[1], rtol=1e-5)
    assert int(trainer.optimizer.iterations.numpy()) == int(trainer.global_step.numpy()) == 1


def test_a_model_that_applies_its_update_refuses_clipping():
    trainer = Trainer(_ModelAppliesItsUpdate("tf_keras"), clip_norm=1.0)
    with pytest.raises(ctl.UserError, match=r"updates the model through its own optimizer"):
        trainer.train(tf.constant(1))


# A model that makes variables on its first call.


def test_variables_a_model_makes_on_its_first_call_are_trained(strategy):
    """One SGD step: the late head moves by -lr * g (the body is the identity), the body too."""
    learning_rate = 0.1
    trainer = Trainer(LateHeadTask("tf_keras", learning_rate=learning_rate), strategy=strategy)
    assert len(trainer.model.trainable_variables) == 2  # The head is not there yet.
    train(trainer, steps=1)
    assert len(trainer.model.trainable_variables) == 4
    features, targets = first_batch(8)
    gradient = mse_gradient(features, targets, np.zeros((3, 1)), np.zeros(1))
    head = trainer.model.head.get_weights()
    np.testing.assert_allclose(head[0], -learning_rate * gradient[0], rtol=1e-5)
    np.testing.assert_allclose(head[1], -learning_rate * gradient[1], rtol=1e-5)


def test_accumulation_refuses_variables_made_after_the_trainer():
    trainer = Trainer(LateHeadTask("tf_keras"), accumulation_steps=2)
    with pytest.raises(ctl.UserError, match=r"made variables on its first call"):
        trainer.train(tf.constant(1))


# XLA.


@pytest.mark.parametrize("flavor", FLAVOR_NAMES)
def test_xla_trains_as_without_it(strategy, flavor):
    compiled = Trainer(RegressionTask(flavor), strategy=strategy, jit_compile=True)
    plain = Trainer(RegressionTask(flavor), strategy=strategy)
    train(compiled, steps=5, steps_per_loop=5)
    train(plain, steps=5, steps_per_loop=5)
    for a, b in zip(weights(compiled.model), weights(plain.model)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_xla_names_the_op_it_cannot_compile():
    trainer = Trainer(SlowRegressionTask(delay=0.0), jit_compile=True)
    with pytest.raises(ctl.UserError, match=r"XLA cannot compile SlowRegressionTask.train_step: "
                                            r"its op 'PyFunc'.*jit_compile=False"):
        trainer.train(tf.constant(1))


# Learning-rate schedules.


def test_warmup_schedule_from_gin_is_summarized_at_its_current_value():
    gin.parse_config("""
        RegressionTask.learning_rate = @ctl.with_warmup()
        ctl.with_warmup.schedule = @keras.optimizers.schedules.ExponentialDecay()
        ctl.with_warmup.warmup_steps = 4
        keras.optimizers.schedules.ExponentialDecay.initial_learning_rate = 0.2
        keras.optimizers.schedules.ExponentialDecay.decay_steps = 1
        keras.optimizers.schedules.ExponentialDecay.decay_rate = 0.5
    """)
    trainer = Trainer(gin.get_configurable(RegressionTask)())
    at_target = 0.2 * 0.5**4  # The decayed rate where the warmup ends.
    assert float(train(trainer, 2, 2)["learning_rate"]) == pytest.approx(at_target * 2 / 4)
    assert float(train(trainer, 2, 2)["learning_rate"]) == pytest.approx(at_target)
    assert float(train(trainer, 2, 2)["learning_rate"]) == pytest.approx(0.2 * 0.5**6)


# Bad settings.


@pytest.mark.parametrize("setting, value, message", [
    ("mixed_precision", "float16", "Expected one of: mixed_float16, mixed_bfloat16"),
    ("jit_compile", "yes", "must be True or False"),
    ("clip_norm", 0.0, "must be a positive number"),
    ("accumulation_steps", 0, "must be a positive integer"),
    ("ema_decay", 1.0, "between 0 and 1"),
])
def test_bad_settings_are_user_errors(setting, value, message):
    with pytest.raises(ctl.UserError, match=f"ctl.Trainer.{setting}.*{message}"):
        Trainer(RegressionTask(), **{setting: value})
