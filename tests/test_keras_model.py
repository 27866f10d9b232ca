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


PLAIN = """
ctl.Experiment.task = @ctl.KerasModelTask()
ctl.KerasModelTask.model_fn = 'tests.contract_tasks.plain_model'
ctl.KerasModelTask.train_data = 'tests.contract_tasks.plain_train_data'
ctl.KerasModelTask.eval_data = 'tests.contract_tasks.plain_eval_data'
ctl.KerasModelTask.batch_size = 8
ctl.KerasModelTask.shuffle_buffer = 0
ctl.Schedule.train_steps = 16
ctl.Schedule.steps_per_loop = 8
ctl.Schedule.eval_interval = None
ctl.Schedule.checkpoint_interval = 16
"""


def test_plain_functions_by_path_train_and_the_model_comes_back(tmp_path):
    from ctl.config import gin_config as config
    from tests import contract_tasks

    config.parse([], [line for line in PLAIN.strip().splitlines()])
    results = ctl.run_experiment("train_and_eval", str(tmp_path))

    model = ctl.restore_model(contract_tasks.plain_model(), str(tmp_path))
    expected = model.evaluate(*contract_tasks.plain_eval_data(), batch_size=8, return_dict=True,
                              verbose=0)
    np.testing.assert_allclose(results["loss"], expected["loss"], rtol=1e-5)
    np.testing.assert_allclose(results["mae"], expected["mae"], rtol=1e-5)
    assert not np.allclose(model.get_weights()[1], 0.0)  # Trained: the bias moved.


def test_restoring_into_another_model_or_from_no_run_is_named(tmp_path):
    with pytest.raises(ctl.UserError, match=r"holds no checkpoint"):
        ctl.restore_model(compiled("keras3")(), str(tmp_path))
    experiment = ctl.Experiment(task=task("keras3"), schedule=ctl.Schedule(
        train_steps=2, steps_per_loop=2, eval_interval=None, checkpoint_interval=2))
    ctl.run_experiment("train", str(tmp_path), experiment=experiment)
    other = FLAVORS["keras3"].Sequential([FLAVORS["keras3"].Input((3,)),
                                          FLAVORS["keras3"].layers.Dense(2)])
    with pytest.raises(ctl.UserError, match=r"checkpoint of a different model .* build `model` "
                                            r"as the run's task built it"):
        ctl.restore_model(other, str(tmp_path))


@pytest.mark.parametrize("binding, message", [
    ("ctl.KerasModelTask.model_fn = @plain_model",
     r"No configurable matching reference '@plain_model'.*needs @gin.configurable .*"
     r"'package.module.function' string"),
    ("ctl.KerasModelTask.model_fn = 'tests.contract_tasks.no_such_model'",
     r"module 'tests.contract_tasks' has no function 'no_such_model'"),
    ("ctl.KerasModelTask.model_fn = 'no_such_package.models.my_model'",
     r"cannot import 'no_such_package.models'"),
    ("ctl.KerasModelTask.model_fn = 'my_model'", r"must be a function: bind a "
     r"'package.module.function' string"),
])
def test_a_model_fn_gin_cannot_find_names_the_fix(binding, message):
    from ctl.config import gin_config as config
    from ctl.experiment import Experiment

    bindings = [line for line in PLAIN.strip().splitlines() if "model_fn" not in line]
    with pytest.raises(ctl.UserError, match=message):
        config.parse([], ["import tests.contract_tasks"] + bindings + [binding])
        config.call_configured(Experiment)
