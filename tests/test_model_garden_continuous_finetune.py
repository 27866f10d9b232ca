"""`python -m ctl.train --mode=continuous_train_and_eval`: Model Garden NLP's continuous fine-tuning.

The zoo's tiny BERT sentence prediction (bench/model_garden_zoo) fine-tunes from each checkpoint of a
"pretraining" dir the test writes (the encoder of the same tiny BERT, its weights shifted by a hundredth
of the pretraining step, and a `global_step`): each checkpoint once, in order, in its own fine-tune dir,
its metrics written as Model Garden writes them (`metrics-<step>.json`, summaries in `eval/` at the
pretraining step); a kill -9 in a fine-tune, then the same command, goes on with that fine-tune and
redoes none; the job ends 0 once no checkpoint came for the experiment's timeout.
"""

import json
import os

import numpy as np
import pytest
import tensorflow as tf
import yaml

from ctl.model_dir import ModelDir
from tests.support.processes import Process, ctl_command, run_ctl
from tests.support.reading import ctl_stderr_lines, scalars

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("model_garden_train")]

EXPERIMENT = "bert/sentence_prediction"
STEPS = 2  # Each fine-tune: 2 steps, a checkpoint after each, an evaluation at the end.
PRETRAIN_STEPS = (10, 20)
WAIT_S = 1200  # Bound on each wait: the 2-core host is shared (a quiet one takes minutes).


def config_files(tmp_path, pretrain_dir):
    """The zoo's tiny variant and its data, then the user's YAML: `--config_file` each."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import official.nlp.configs.finetuning_experiments  # noqa: F401 (registers it)
    from bench.model_garden_zoo import data, variants

    user = {"task": {"init_checkpoint": str(pretrain_dir)},
            "trainer": {"train_steps": STEPS, "steps_per_loop": 1, "summary_interval": 1,
                        "checkpoint_interval": 1, "validation_interval": STEPS,
                        "continuous_eval_timeout": 3,
                        "best_checkpoint_export_subdir": "best_ckpt",
                        "best_checkpoint_eval_metric": "cls_accuracy"}}
    overrides = (variants.overrides(EXPERIMENT, STEPS)
                 + data.data_overrides(EXPERIMENT, str(tmp_path / "data")) + [user])
    paths = []
    for index, override in enumerate(overrides):
        path = tmp_path / f"config{index}.yaml"
        path.write_text(yaml.safe_dump(override))
        paths.append(str(path))
    return paths, overrides


def build_model(overrides):
    """The fine-tuned model, built as Model Garden builds it."""
    from official.core import task_factory

    from ctl.adapters.model_garden import experiment_config

    params = experiment_config(EXPERIMENT, (), overrides)
    return task_factory.get_task(params.task).build_model()


def encoder_weights(model):
    return np.concatenate([w.numpy().ravel() for w in model.checkpoint_items["encoder"].weights])


def write_pretraining(pretrain_dir, model):
    """ckpt-10 and ckpt-20, as a pretraining run writes them (`encoder`, `global_step`): the
    encoder's weights shifted by a hundredth of the step, so that a fine-tune shows which one it
    started from. Returns the mean of the weights before the shift."""
    encoder = model.checkpoint_items["encoder"]
    start = [w.numpy() for w in encoder.weights]
    global_step = tf.Variable(0, dtype=tf.int64)
    manager = tf.train.CheckpointManager(
        tf.train.Checkpoint(encoder=encoder, global_step=global_step), str(pretrain_dir),
        max_to_keep=5)
    for step in PRETRAIN_STEPS:
        for weight, value in zip(encoder.weights, start):
            weight.assign(value + step / 100)
        global_step.assign(step)
        manager.save(checkpoint_number=step)
    return float(np.mean(np.concatenate([v.ravel() for v in start])))


def mean_encoder_weight(checkpoint, model):
    """The mean of the encoder's weights in a fine-tune's checkpoint (ctl's: `model` at its root)."""
    tf.train.Checkpoint(model=model).read(checkpoint).expect_partial()
    return float(np.mean(encoder_weights(model)))


@pytest.mark.timeout(3 * WAIT_S)
def test_each_pretraining_checkpoint_is_fine_tuned_once_in_order_across_a_kill_9(tmp_path):
    pretrain_dir, model_dir = tmp_path / "pretraining", tmp_path / "finetuning"
    files, overrides = config_files(tmp_path, pretrain_dir)
    model = build_model(overrides)
    start_mean = write_pretraining(pretrain_dir, model)
    held, release = tmp_path / "held", tmp_path / "release"
    probe = tmp_path / "probe.gin"
    probe.write_text("import tests.model_garden_tasks\n"
                     "ctl.Experiment.hooks = [@HoldAfterCheckpoint()]\n"
                     "HoldAfterCheckpoint.directory_name = 'ckpt-20'\n"
                     "HoldAfterCheckpoint.name = 'ckpt-1'\n"
                     f"HoldAfterCheckpoint.held_file = {str(held)!r}\n"
                     f"HoldAfterCheckpoint.release_file = {str(release)!r}\n")
    command = ctl_command(f"--experiment={EXPERIMENT}", "--mode=continuous_train_and_eval",
                          f"--model_dir={model_dir}", *(f"--config_file={f}" for f in files),
                          f"--pretrain_steps={PRETRAIN_STEPS[-1]}", f"--gin_file={probe}",
                          module="ctl.train")
    # The first job: the fine-tune of ckpt-10, then that of ckpt-20, killed after its first step.
    with Process(command) as first:
        assert first.wait_until(held.exists, timeout=WAIT_S), first.stderr()[-4000:]
        first.kill()
    assert first.returncode == -9
    directory = ModelDir(str(model_dir))
    assert [r["number"] for r in directory.sidecar_evaluations()] == [10]
    assert sorted(ModelDir(str(model_dir / "finetune" / "ckpt-20")).checkpoints()) == [1]
    # The same command: the fine-tune of ckpt-20 goes on from its step 1; ckpt-10's is not redone.
    release.touch()
    with Process(command) as again:
        result = again.finish(timeout=WAIT_S)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "fine-tuning from ckpt-10" in first.stdout()
    assert "fine-tuning from ckpt-10" not in result.stdout
    assert f"restored model from {model_dir / 'finetune' / 'ckpt-20' / 'ckpt-1'}" in result.stdout
    assert "initialized the model" not in result.stdout
    assert "no new checkpoint in" in result.stdout  # It ended on the timeout.
    records = directory.sidecar_evaluations()
    assert [(r["number"], r["step"]) for r in records] == [(10, 10), (20, 20)]
    resumed = ModelDir(str(model_dir / "finetune" / "ckpt-20"))
    assert [r["step"] for r in resumed.metrics("train")] == [1, 2]  # Step 1 before the kill.
    for step in PRETRAIN_STEPS:
        finetune = model_dir / "finetune" / f"ckpt-{step}"
        # Each fine-tune started from its pretraining checkpoint (the weights moved by 2 steps only).
        assert mean_encoder_weight(str(finetune / "ckpt-2"), model) == pytest.approx(
            start_mean + step / 100, abs=0.02)
        params = yaml.safe_load((finetune / "params.yaml").read_text())
        assert params["task"]["init_checkpoint"] == str(pretrain_dir / f"ckpt-{step}")
        assert (finetune / f"best_ckpt_{step}" / "info.json").exists()
        # Model Garden's JSON summary, and its summaries in eval/ at the pretraining step.
        final = ModelDir(str(finetune)).metrics("eval")[-1]
        assert final["step"] == STEPS
        summary = json.loads((model_dir / f"metrics-{step}.json").read_text())
        assert float(summary["cls_accuracy"]) == pytest.approx(final["cls_accuracy"])
        assert float(summary["validation_loss"]) == pytest.approx(final["loss"])
    tags = scalars(str(model_dir / "eval"))
    assert set(tags["finetuning_sentence_prediction_task/cls_accuracy"]) == set(PRETRAIN_STEPS)
    assert set(tags["finetuning_sentence_prediction_task/validation_loss"]) == set(PRETRAIN_STEPS)
    assert yaml.safe_load((model_dir / "params.yaml").read_text())["task"][
        "init_checkpoint"] == str(pretrain_dir)


def test_a_job_without_a_directory_to_fine_tune_from_ends_in_one_line(tmp_path):
    from ctl.adapters import model_garden_command as garden
    from ctl.utils.errors import UserError

    files, _ = config_files(tmp_path, tmp_path / "pretraining")
    # task.init_checkpoint not set: `python -m ctl.train`'s check of the experiment's config, in this
    # process (its one line through the command: the case below).
    params, _ = garden.experiment_params(EXPERIMENT, files, None, None, "task.init_checkpoint=''")
    with pytest.raises(UserError) as unset:
        garden.watched_directory(params)
    assert str(unset.value) == (
        "--mode=continuous_train_and_eval fine-tunes from each checkpoint of the "
        "directory task.init_checkpoint names, which is not set; set it to the pretraining run's "
        "model dir in --config_file or --params_override.")
    common = [f"--experiment={EXPERIMENT}", "--mode=continuous_train_and_eval",
              f"--model_dir={tmp_path / 'run'}", *(f"--config_file={f}" for f in files)]
    # Not there after the experiment's timeout (3 s): one line, and nothing written.
    missing = run_ctl(*common, module="ctl.train")
    assert missing.returncode == 2
    [line] = ctl_stderr_lines(missing.stderr)
    assert line.startswith(f"ctl.train: error: task.init_checkpoint={tmp_path / 'pretraining'} is "
                           "not a directory after 3 s"), line
    assert not (tmp_path / "run").exists()
