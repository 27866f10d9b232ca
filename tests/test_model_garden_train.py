"""`python -m ctl.train`: Model Garden's `official.vision.train` command with the module name changed.

The user's command of issue #51, on the zoo's tiny RetinaNet (bench/model_garden_zoo: a ResNet-18 at
depth 0.25 with FPN on 128x128 generated tf.Examples and their COCO annotation file), with YAML files
(`--config_file`, repeated) whose trainer settings keep a best checkpoint by the eval loss and whose runtime
asks for bfloat16: ctl trains with checkpoints and evaluations at the YAML's steps, writes the best
checkpoint where Model Garden writes it, `params.yaml` and `validation/`, builds the model in
bfloat16; Model Garden's own `--mode=continuous_eval` then evaluates ctl's model dir unchanged.
"""

import json
import os
import subprocess
import sys

import pytest
import tensorflow as tf
import yaml

from tests.support.env import ROOT, ctl_env
from tests.support.processes import run, run_ctl
from tests.support.reading import scalars

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("model_garden_train")]

EXPERIMENT = "retinanet_resnetfpn_coco"
TIMEOUT_S = 900  # Bound on each process: the 2-core host is shared.
USER_YAML = {
    "task": {"init_checkpoint": ""},  # Its default backbone checkpoint is in a public bucket.
    "trainer": {"train_steps": 4, "steps_per_loop": 2, "summary_interval": 2,
                "checkpoint_interval": 2, "validation_interval": 2, "max_to_keep": 5,
                "continuous_eval_timeout": 1,
                "best_checkpoint_export_subdir": "best_ckpt",
                # Model Garden's name for the eval loss, ctl's `loss`; lower is better.
                "best_checkpoint_eval_metric": "validation_loss",
                "best_checkpoint_metric_comp": "lower"},
    "runtime": {"mixed_precision_dtype": "bfloat16"},
}


def config_files(tmp_path):
    """The zoo's tiny variant and its data as YAML files, then the user's: `--config_file` each."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import official.vision.registry_imports  # noqa: F401
    from bench.model_garden_zoo import data, variants

    paths = []
    for index, override in enumerate(variants.overrides(EXPERIMENT, 4)
                                     + data.data_overrides(EXPERIMENT, str(tmp_path / "data"))
                                     + [USER_YAML]):
        path = tmp_path / f"config{index}.yaml"
        path.write_text(yaml.safe_dump(override))
        paths.append(f"--config_file={path}")
    return paths


@pytest.mark.timeout(2 * TIMEOUT_S)  # Two TensorFlow processes, one after the other, on a loaded host.
def test_the_users_command_trains_as_its_yaml_says_and_model_garden_evaluates_the_model_dir(tmp_path):
    model_dir = tmp_path / "run"
    files = config_files(tmp_path)
    policies = tmp_path / "policies.json"
    probe = tmp_path / "probe.gin"
    probe.write_text("import tests.model_garden_tasks\n"
                     "ctl.Experiment.hooks = [@PolicyRecorder()]\n"
                     f"PolicyRecorder.path = {str(policies)!r}\n")
    result = run_ctl(f"--experiment={EXPERIMENT}", "--mode=train_and_eval",
                     f"--model_dir={model_dir}", *files, f"--gin_file={probe}",
                     module="ctl.train", timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ctl.Trainer.mixed_precision = 'mixed_bfloat16'  (the experiment's " \
           "runtime.mixed_precision_dtype)" in result.stdout
    # Checkpoints and evaluations at the YAML's steps, not ctl's defaults.
    names = sorted(name for name in os.listdir(model_dir) if name.endswith(".index"))
    assert names == ["ckpt-2.index", "ckpt-4.index"], names
    evaluated = scalars(str(model_dir / "eval"))["AP"]
    assert sorted(evaluated) == [2, 4]
    assert sorted(scalars(str(model_dir / "validation"))["AP"]) == [2, 4]
    # The best checkpoint by the eval loss, lower is better, where Model Garden writes it.
    losses = scalars(str(model_dir / "eval"))["loss"]
    info = json.loads((model_dir / "best_ckpt" / "info.json").read_text())
    assert info["validation_loss"] == pytest.approx(min(losses.values()), rel=1e-6)
    assert losses[info["best_ckpt_global_step"]] == min(losses.values())
    assert os.path.exists(model_dir / "best_ckpt" / f"best_ckpt-{info['best_ckpt_global_step']}.index")
    params = yaml.safe_load((model_dir / "params.yaml").read_text())
    assert params["runtime"]["mixed_precision_dtype"] == "bfloat16"
    assert params["trainer"]["best_checkpoint_eval_metric"] == "validation_loss"
    # The model was built in bfloat16: every layer with weights computes in it.
    dtypes = json.loads(policies.read_text())
    assert dtypes and set(dtypes.values()) == {"bfloat16"}, dtypes
    # Model Garden's own command evaluates ctl's model dir, unchanged: its last checkpoint, into
    # validation/ (after its timeout of 1 s without a new one, as the step count is reached).
    ctl_files = set(os.listdir(model_dir / "validation"))
    garden = run([sys.executable, "-m", "official.vision.train", f"--experiment={EXPERIMENT}",
                  "--mode=continuous_eval", f"--model_dir={model_dir}", *files], timeout=TIMEOUT_S)
    assert garden.returncode == 0, garden.stderr[-3000:]
    written = set(os.listdir(model_dir / "validation")) - ctl_files
    assert len(written) == 1, written
    steps = {event.step for event in tf.compat.v1.train.summary_iterator(
        str(model_dir / "validation" / written.pop()))
        for value in event.summary.value if value.tag == "AP"}
    assert steps == {4}


RANKING = "dcn_criteo"


@pytest.mark.timeout(TIMEOUT_S)
def test_a_ranking_experiment_trains_without_tf_use_legacy_keras_in_the_environment(tmp_path):
    """Model Garden's ranking module (tensorflow_recommenders) needs tf.keras to be tf_keras:
    `ctl.train` sets `TF_USE_LEGACY_KERAS=1` itself, before Model Garden's registries use tf.keras
    (which reads it once), so the user's command needs nothing in the environment."""
    import official.recommendation.ranking.configs.config  # noqa: F401  (registers it)
    from bench.model_garden_zoo import command, data, variants

    config = tmp_path / "ranking.yaml"  # The zoo's tiny DCN (16-id vocabularies) on its files.
    config.write_text(yaml.safe_dump(command.merged(
        variants.overrides(RANKING, 2) + data.data_overrides(RANKING, str(tmp_path / "data"))
        + [{"trainer": {"steps_per_loop": 2, "checkpoint_interval": 2}}])))
    env = {name: value for name, value in ctl_env({"TF_CPP_MIN_LOG_LEVEL": "2"}).items()
           if name != "TF_USE_LEGACY_KERAS"}
    result = subprocess.run([sys.executable, "-m", "ctl.train", f"--experiment={RANKING}",
                             "--mode=train", f"--model_dir={tmp_path / 'run'}",
                             f"--config_file={config}"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stderr[-3000:]
    assert tf.train.latest_checkpoint(str(tmp_path / "run")).endswith("ckpt-2")
