"""`ctl.KerasModelTask`: a compiled Keras model trains under ctl as `model.fit` trains it."""

import numpy as np
import pytest
import tensorflow as tf

import ctl
from tests.tasks import FLAVORS, regression_data

STEPS, BATCH = 16, 8


def compiled(flavor):
    def model_fn():
        k = FLAVORS[flavor]
        model = k.Sequential([
            k.Input((3,)),
            k.layers.Dense(4, kernel_initializer=k.initializers.Constant(0.1),
                           kernel_regularizer=k.regularizers.L2(0.01)),
            k.layers.Dense(1, kernel_initializer="ones"),
        ])
        model.compile(optimizer=k.optimizers.SGD(0.05, momentum=0.9), loss="mse",
                      metrics=["mae"])
        return model
    return model_fn


def task(flavor, **kwargs):
    return ctl.KerasModelTask(model_fn=compiled(flavor), train_data=lambda: regression_data(64),
                              eval_data=lambda: regression_data(20, seed=1), batch_size=BATCH,
                              shuffle_buffer=0, **kwargs)


@pytest.mark.parametrize("flavor", sorted(FLAVORS))
def test_trains_like_fit_with_the_compiled_loss_metrics_and_optimizer(tmp_path, strategy, flavor):
    experiment = ctl.Experiment(task=task(flavor), schedule=ctl.Schedule(
        train_steps=STEPS, steps_per_loop=4, eval_interval=None, checkpoint_interval=STEPS))
    results = ctl.run_experiment("train_and_eval", str(tmp_path), strategy, experiment)

    reference = compiled(flavor)()  # The same model, data and batches through fit.
    x, y = regression_data(64)
    reference.fit(x, y, batch_size=BATCH, epochs=STEPS * BATCH // 64, shuffle=False, verbose=0)
    trained = compiled(flavor)()
    tf.train.Checkpoint(model=trained).read(
        tf.train.latest_checkpoint(str(tmp_path))).expect_partial()
    for ours, theirs in zip(trained.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-6)
    expected = reference.evaluate(*regression_data(20, seed=1), batch_size=BATCH,
                                  return_dict=True, verbose=0)
    assert set(results) >= {"loss", "mae"}
    np.testing.assert_allclose(results["mae"], expected["mae"], rtol=1e-4)
    # fit's loss includes the L2 penalty; so does ours.
    np.testing.assert_allclose(results["loss"], expected["loss"], rtol=1e-4)


def test_a_model_that_is_not_compiled_is_named(tmp_path):
    def uncompiled():
        return FLAVORS["keras3"].Sequential([FLAVORS["keras3"].Input((3,)),
                                             FLAVORS["keras3"].layers.Dense(1)])

    experiment = ctl.Experiment(
        task=ctl.KerasModelTask(model_fn=uncompiled, train_data=lambda: regression_data(8)),
        schedule=ctl.Schedule(train_steps=1))
    with pytest.raises(ctl.UserError, match=r"not a compiled Keras model; call model.compile"):
        ctl.run_experiment("train", str(tmp_path), experiment=experiment)
    assert not any(tmp_path.iterdir())


def test_data_of_another_shape_is_named():
    with pytest.raises(ctl.UserError, match=r"train_data returned dict; return fit's \(x, y\)"):
        ctl.KerasModelTask(model_fn=compiled("keras3"), train_data=lambda: {"x": 1}).build_model()
