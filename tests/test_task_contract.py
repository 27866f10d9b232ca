"""The Task contract, checked when a run starts (ctl.core.contract), and who adds regularization.

Each common mistake (tests/contract_tasks.py) ends in a `UserError` naming the
problem and the fix before the model dir is written, on the default and the
mirrored strategy (in this process: the library is what the CLI calls); a few
go through `python -m ctl.run`, in train and smoke modes, for the one line on
stderr and exit status 2. A train set that ends is repeated, as `fit` runs
epochs. The model's losses (L2) are counted once, whether `build_losses` adds
`aux_losses` or ignores them, in Keras 3 and tf_keras, on both strategies.
"""

import concurrent.futures
import os
import re

import numpy as np
import pytest
import tensorflow as tf

import ctl
from tests import contract_tasks as tasks
from tests.support.processes import run_ctl
from tests.support.reading import ctl_stderr_lines
from tests.tasks import regression_data

SCHEDULE = dict(train_steps=20, steps_per_loop=10, eval_interval=None, checkpoint_interval=20)

# name -> (task, what the one line says)
MISTAKES = {
    "no labels": (tasks.NoLabelsTask, r"NoLabelsTask.build_inputs\(training=True\) yields one "
                  r"tensor of shape \(\d, 3\); the default train_step takes \(features, labels\)"),
    "dict elements": (tasks.DictElementsTask, r"yields a dict with keys x, y .*return a dataset "
                      r"of \(features, labels\)"),
    "sample weights": (tasks.WeightsTask, r"yields a tuple of 3 parts; the default train_step"),
    "unbatched": (tasks.UnbatchedTask, r"yields unbatched elements \(\[1\]the element has shape "
                  r"\(\), one example\); batch it"),
    "mismatched batches": (tasks.MismatchedBatchesTask, r"different batch sizes \[4, 8\]"),
    "arrays, not a dataset": (tasks.ArraysTask, r"build_inputs\(training=True\) returned a tuple; "
                              r"return a tf.data.Dataset"),
    "empty train set": (tasks.EmptyTrainSetTask, r"returned an empty dataset"),
    "repeated eval set": (tasks.RepeatedEvalSetTask, r"eval set never ends \(it repeats\) and "
                          r"ctl.Schedule.eval_steps is not set"),
    "per-example loss": (tasks.VectorLossTask, r"VectorLossTask.build_losses returned a loss of "
                         r"shape \(\d,\), not a scalar; return the mean"),
    "train_step returns a tensor": (tasks.TensorLogsTask, r"TensorLogsTask.train_step returned a "
                                    r"tensorflow.\w+; return a dict"),
    "no apply_gradients": (tasks.NoUpdateTask, r"did not call optimizer.apply_gradients"),
    "model and data disagree": (tasks.MisshapenModelTask, r"MisshapenModelTask.train_step fails "
                                r"on the train set's batches.*value 5.*shape \(\d, 3\)"),
    "one metric, not a list": (tasks.OneMetricTask, r"build_metrics\(training=True\) returned a "
                               r"keras.MeanAbsoluteError; return a list of Keras metrics"),
    "metric names": (tasks.MetricNamesTask, r"returned the string 'mae' in its list; every entry "
                     r"must be a Keras metric object"),
    "two metrics, one name": (tasks.SameNameMetricsTask, r"two results named 'error'"),
    "optimizer name": (tasks.OptimizerNameTask, r"build_optimizer\(\) returned the string 'sgd'; "
                       r"return an optimizer object"),
    "tf_keras optimizer, Keras 3 model": (tasks.MixedKerasTask, r"returned a tf_keras optimizer "
                                          r"\(SGD\) for a Keras 3 model"),
    "model function, not a model": (tasks.ModelFunctionTask, r"build_model\(\) returned a "
                                    r"builtins.method; return a Keras model"),
}


def test_there_are_fifteen_common_mistakes():
    assert len(MISTAKES) >= 15


@pytest.mark.parametrize("name", sorted(MISTAKES))
def test_a_task_mistake_is_one_user_error_before_the_model_dir_is_written(name, strategy,
                                                                         tmp_path):
    task, message = MISTAKES[name]
    model_dir = str(tmp_path / "run")
    experiment = ctl.Experiment(task=task(), schedule=ctl.Schedule(**SCHEDULE))
    with pytest.raises(ctl.UserError) as raised:
        ctl.run_experiment("train_and_eval", model_dir, strategy, experiment)
    line = str(raised.value).splitlines()[0]  # What ctl.run prints (gin may add lines).
    assert re.search(message, line), line
    assert not os.path.exists(model_dir)


@pytest.mark.parametrize("task", [tasks.FiniteTrainSetTask, tasks.UnknownLengthTrainSetTask])
def test_a_train_set_that_ends_is_repeated_as_fit_runs_epochs(task, strategy, tmp_path, caplog):
    # 64 examples in batches of 8: 20 steps read the set two and a half times.
    experiment = ctl.Experiment(task=task(), schedule=ctl.Schedule(**SCHEDULE))
    results = ctl.run_experiment("train_and_eval", str(tmp_path), strategy, experiment)
    assert np.isfinite(results["loss"])
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-20")
    said = "\n".join(record.getMessage() for record in caplog.records)
    if task is tasks.FiniteTrainSetTask:  # Its length is known: one line says so.
        replicas = strategy.num_replicas_in_sync  # Each reads batches of 8 / replicas.
        assert (f"train set ends after {8 * replicas} batches of this input pipeline: ctl "
                "repeats it (a pass every 8 global batches)") in said


def test_train_batches_without_a_static_size_are_named_in_a_warning(tmp_path, caplog):
    experiment = ctl.Experiment(task=tasks.DynamicBatchTask(), schedule=ctl.Schedule(**SCHEDULE))
    ctl.run_experiment("train", str(tmp_path), experiment=experiment)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("DynamicBatchTask's train batches have no static size" in w for w in warnings)


def test_sparse_features_train_and_evaluate(strategy, tmp_path):
    # Before any step ctl traces the train step on the dataset's element spec; a SparseTensor
    # there has its static shape as its dense_shape, as the train loop's iterator gives it
    # (Model Garden's DCN v2 failed the check, and trained under its own trainer; at two
    # replicas too: each replica's SparseTensors, inside the replica function). Its eval
    # step waits for the inputs' component tensors.
    experiment = ctl.Experiment(task=tasks.SparseFeaturesTask(), schedule=ctl.Schedule(
        train_steps=2, steps_per_loop=2, eval_interval=2, checkpoint_interval=2))
    results = ctl.run_experiment("train_and_eval", str(tmp_path), strategy, experiment)
    assert np.isfinite(results["loss"]) and results["examples"] == 10


def test_a_repeated_eval_set_is_read_for_eval_steps(strategy, tmp_path):
    experiment = ctl.Experiment(task=tasks.RepeatedEvalSetTask(),
                                schedule=ctl.Schedule(**SCHEDULE, eval_steps=3))
    results = ctl.run_experiment("train_and_eval", str(tmp_path), strategy, experiment)
    assert np.isfinite(results["loss"])


# Through the CLI: one line on stderr, exit 2, nothing written; smoke mode too.

CLI_CASES = {  # name -> (mode, task, what the line says)
    "no labels": ("train", "NoLabelsTask", "yields one tensor of shape (8, 3); the default "
                  "train_step takes (features, labels) pairs"),
    "per-example loss in smoke": ("smoke", "VectorLossTask", "smoke test failed at train: "
                                  "VectorLossTask.build_losses returned a loss of shape (8,), not "
                                  "a scalar; return the mean over this replica's batch (e.g. "
                                  "tf.reduce_mean(per_example_loss)): ctl neither sums nor "
                                  "averages it for you."),
    "repeated eval set": ("train_and_eval", "RepeatedEvalSetTask", "eval set never ends"),
}


@pytest.mark.slow
def test_task_mistakes_through_the_cli(tmp_path):
    def one(name):
        mode, task, message = CLI_CASES[name]
        model_dir = str(tmp_path / name.replace(" ", "_"))
        result = run_ctl(f"--mode={mode}", f"--model_dir={model_dir}",
                         "--gin_file=tests/regression.gin", "--gin_bindings=import tests.contract_tasks",
                         f"--gin_bindings=ctl.Experiment.task=@{task}()")
        lines = ctl_stderr_lines(result.stderr)
        problems = []
        if result.returncode != 2 or len(lines) != 1 or message not in lines[0]:
            problems.append(f"{name}: exit {result.returncode}, stderr {lines}")
        if os.path.exists(model_dir):
            problems.append(f"{name}: wrote {os.listdir(model_dir)}")
        return problems

    with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
        problems = [p for found in pool.map(one, CLI_CASES) for p in found]
    assert not problems, "\n".join(problems)


# Regularization: counted once, whoever adds it.


@pytest.mark.parametrize("adds_aux", [False, True], ids=["ctl adds aux", "task adds aux"])
@pytest.mark.parametrize("flavor", ["keras3", "tf_keras"])
def test_the_l2_penalty_is_in_the_gradient_and_the_loss_once(flavor, adds_aux, strategy, tmp_path):
    """One SGD step, then the final evaluation: the trained weights and the eval loss each
    equal NumPy's with the penalty counted once."""
    task = tasks.RegularizedTask(flavor=flavor, adds_aux=adds_aux, learning_rate=0.01)
    experiment = ctl.Experiment(task=task, schedule=ctl.Schedule(
        train_steps=1, steps_per_loop=1, eval_interval=None, checkpoint_interval=1))
    results = ctl.run_experiment("train_and_eval", str(tmp_path), strategy, experiment)
    # One SGD step on the first global batch, by hand.
    features, targets = (t[:task.batch_size] for t in regression_data(task.train_examples))
    kernel = tf.Variable(np.full((3, 1), task.KERNEL, np.float32))
    bias = tf.Variable(np.zeros((1,), np.float32))
    with tf.GradientTape() as tape:
        loss = (tf.reduce_mean(tf.square(targets - (features @ kernel + bias)))
                + task.L2 * tf.reduce_sum(tf.square(kernel)))
    kernel_gradient, bias_gradient = tape.gradient(loss, [kernel, bias])
    kernel = kernel.numpy() - 0.01 * kernel_gradient.numpy()
    bias = bias.numpy() - 0.01 * bias_gradient.numpy()
    trained = task.build_model()
    tf.train.Checkpoint(model=trained).read(
        tf.train.latest_checkpoint(str(tmp_path))).expect_partial()
    np.testing.assert_allclose(trained.get_weights()[0], kernel, rtol=1e-5)
    np.testing.assert_allclose(trained.get_weights()[1], bias, rtol=1e-5, atol=1e-7)
    eval_loss = task.expected_loss(*regression_data(task.eval_examples, seed=1), kernel, bias)
    assert eval_loss > 3.0  # The penalty (10 * 3 * 0.3 ** 2 = 2.7 before the step) dominates it.
    np.testing.assert_allclose(results["loss"], eval_loss, rtol=1e-5)
