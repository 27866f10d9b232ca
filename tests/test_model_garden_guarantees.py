"""ctl's guarantees on Model Garden's own experiments, through `python -m ctl.run`.

One detection (RetinaNet), one NLP (BERT sentence prediction) and one ranking (DCN) experiment,
each the zoo's tiny variant (bench/model_garden_zoo: overrides only, generated files in the
experiment's input format) run by `ctl.ModelGardenTask` with `ctl.FaultTolerance.seed`:

- kill -9 mid-loop after a checkpoint, then the same command: every step's training loss and the
  final checkpoint bit-identical to an uninterrupted run's (run beside it);
- RetinaNet: a sidecar (`--mode=continuous_eval`) beside the killed and restarted trainer evaluates
  each of its checkpoints once, with the experiment's COCO evaluation (its aggregation);
- BERT: two named eval sets (`ctl.ModelGardenTask.eval_sets`) and the best checkpoint on one of
  them, the same after the kill as in the uninterrupted run.

The steps say what they did from inside the graph (tests/model_garden_tasks.py).
"""

import json
import os

import pytest
import tensorflow as tf

from ctl.hooks.best import best_record
from ctl.model_dir import ModelDir
from tests.model_garden_tasks import read_losses
from tests.support.processes import Process, ctl_command
from tests.support.reading import assert_bit_equal, latest_step, scalars

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("model_garden_guarantees")]

STEPS, LOOP, HOLD_AT = 9, 3, 5  # Loops 1-3, 4-6, 7-9; killed in step 5, after ckpt-3.
WAIT_S = 420  # Bound on every wait: the 2-core host is shared.

# family -> (experiment, the module that registers it, env, overrides beyond the zoo's variant)
FAMILIES = {
    "detection": ("retinanet_resnetfpn_coco", "official.vision.registry_imports", {}, [{"task": {
        # A random start: its default backbone checkpoint is in a public bucket.
        "init_checkpoint": "",
        # Its crowd filter puts constants under a control dependency on the parser's input,
        # which TensorFlow's make_deterministic rewrite of the input pipeline (op determinism,
        # ctl.FaultTolerance.seed) cannot split; the generated boxes have no crowds.
        "train_data": {"parser": {"skip_crowd_during_training": False}}}}]),
    "nlp": ("bert/sentence_prediction", "official.nlp.configs.finetuning_experiments", {},
            # F1: a metric of the task's own aggregation (accuracy is a Keras metric).
            [{"task": {"metric_type": "f1"}}]),
    "ranking": ("dcn_criteo", "official.recommendation.ranking.task",
                {"TF_USE_LEGACY_KERAS": "1"}, []),
}


def overrides(experiment, data_dir):
    from bench.model_garden_zoo import data, variants

    return variants.overrides(experiment, STEPS) + data.data_overrides(experiment, data_dir)


def write_gin(tmp_path, family, *lines, eval_interval=STEPS):
    experiment, module, _, extra = FAMILIES[family]
    if family == "ranking":  # Its configs register it; its task module needs tf_keras' Keras.
        import official.recommendation.ranking.configs.config  # noqa: F401
    else:
        __import__(module)
    path = tmp_path / "experiment.gin"
    path.write_text("\n".join([
        f"import {module}", "import tests.model_garden_tasks",
        "ctl.Experiment.task = @RecordedModelGardenTask()",
        "ctl.Experiment.trainer_cls = @StepTrainer",
        f"RecordedModelGardenTask.experiment = {experiment!r}",
        f"RecordedModelGardenTask.params_override = "
        f"{overrides(experiment, str(tmp_path / 'data')) + extra!r}",
        "ctl.FaultTolerance.seed = 1",
        f"ctl.Schedule.train_steps = {STEPS}", f"ctl.Schedule.steps_per_loop = {LOOP}",
        f"ctl.Schedule.checkpoint_interval = {LOOP}", f"ctl.Schedule.eval_interval = {eval_interval}",
        # The whole generated eval set (the experiment's trainer.validation_steps counts real data's).
        "ctl.Schedule.eval_steps = None",
        *lines, ""]))
    return str(path)


def trainer(gin_file, model_dir, steps_file, *bindings, env=None):
    """`python -m ctl.run --mode=train_and_eval` on `gin_file`, its steps in `steps_file`."""
    return Process(ctl_command(
        "--mode=train_and_eval", f"--model_dir={model_dir}", f"--gin_file={gin_file}",
        f"--gin_bindings=RecordedModelGardenTask.steps_file='{steps_file}'",
        *(f"--gin_bindings={b}" for b in bindings)), env=env)


def finished(process):
    result = process.finish(timeout=WAIT_S)
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def killed_and_resumed(tmp_path, gin_file, model_dir, env=None):
    """Trains with a hold in step HOLD_AT, kills the process there with SIGKILL, then runs the
    same command to the end; returns (steps of the killed process, steps of the resumed one)."""
    steps_file, held, release = (str(tmp_path / n) for n in ("chaos.steps", "held", "release"))
    hold = (f"RecordedModelGardenTask.hold_at_step={HOLD_AT}",
            f"RecordedModelGardenTask.held_file='{held}'",
            f"RecordedModelGardenTask.release_file='{release}'")
    with trainer(gin_file, model_dir, steps_file, *hold, env=env) as first:
        assert first.wait_until(lambda: os.path.exists(held), timeout=WAIT_S), first.stderr()[-4000:]
        first.kill()  # SIGKILL, in step HOLD_AT: mid-loop, after the checkpoint of step LOOP.
    assert first.returncode == -9
    assert latest_step(model_dir) == LOOP
    before = read_losses(steps_file)
    open(release, "w").close()  # The same command: its hold now passes at once.
    with trainer(gin_file, model_dir, steps_file, *hold, env=env) as again:
        finished(again)
    return before, read_losses(steps_file)[len(before):]


def assert_same_training(reference_dir, reference_steps, chaos_dir, killed, resumed):
    """Every step's loss (its float32 bits) and the final checkpoint, the same both ways."""
    straight = dict(read_losses(reference_steps))
    assert [s for s, _ in read_losses(reference_steps)] == list(range(1, STEPS + 1))
    # The killed process ran the steps up to the one it was killed in; the restarted one redid
    # those after the checkpoint (the same losses) and went on.
    assert [s for s, _ in killed] == list(range(1, HOLD_AT))
    assert [s for s, _ in resumed] == list(range(LOOP + 1, STEPS + 1))
    assert dict(killed) == {s: straight[s] for s in range(1, HOLD_AT)}
    assert dict(resumed) == {s: straight[s] for s in range(LOOP + 1, STEPS + 1)}
    assert latest_step(chaos_dir) == latest_step(reference_dir) == STEPS
    assert_bit_equal(tf.train.latest_checkpoint(reference_dir), tf.train.latest_checkpoint(chaos_dir))


def free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_retinanet_kill_9_is_bit_identical_and_the_sidecar_evaluates_each_checkpoint_once(
        tmp_path):
    gin_file = write_gin(tmp_path, "detection")
    reference_dir, chaos_dir = str(tmp_path / "reference"), str(tmp_path / "chaos")
    tf_config = json.dumps({"cluster": {"chief": [f"127.0.0.1:{free_port()}"],
                                        "evaluator": [f"127.0.0.1:{free_port()}"]},
                            "task": {"type": "chief", "index": 0}})
    with trainer(gin_file, reference_dir, str(tmp_path / "reference.steps")) as straight, \
            Process.ctl("--mode=continuous_eval", f"--model_dir={chaos_dir}",
                        merge_stderr=True) as sidecar:
        killed, resumed = killed_and_resumed(tmp_path, gin_file, chaos_dir,
                                             env={"TF_CONFIG": tf_config})
        finished(straight)
        assert sidecar.wait(timeout=WAIT_S) == 0, sidecar.stdout()[-4000:]
    assert_same_training(reference_dir, str(tmp_path / "reference.steps"), chaos_dir, killed,
                         resumed)
    # The sidecar beside the killed and restarted trainer: each checkpoint once, in order, with
    # the experiment's COCO metrics (its aggregate_logs and reduce_aggregated_logs).
    evaluations = ModelDir(chaos_dir).sidecar_evaluations()
    assert [r["number"] for r in evaluations] == [LOOP, 2 * LOOP, STEPS]
    for record in evaluations:
        assert {"AP", "AP50", "ARmax100", "loss"} <= set(record["results"]), record
    assert "eval | step" not in sidecar.stdout().split("finished:")[-1]
    # The same evaluation as the uninterrupted run's in-line one of the same weights.
    inline = ModelDir(reference_dir).metrics("eval")[-1]
    assert inline["step"] == STEPS
    for name in ("AP", "AP50", "ARmax100", "loss"):
        assert evaluations[-1]["results"][name] == pytest.approx(inline[name], rel=1e-5), name


def test_bert_kill_9_is_bit_identical_with_named_eval_sets_and_the_best_checkpoint(tmp_path):
    import official.nlp.configs.finetuning_experiments  # noqa: F401 (registers it)
    from bench.model_garden_zoo import data

    train_files = data.data_overrides("bert/sentence_prediction", str(tmp_path / "data"))[0][
        "task"]["train_data"]["input_path"]
    gin_file = write_gin(
        tmp_path, "nlp",
        # The generated eval set, and the train files read as an eval set.
        f"RecordedModelGardenTask.eval_sets = {{'held_out': {{}}, "
        f"'train': {{'input_path': {train_files!r}}}}}",
        "ctl.Experiment.hooks = [@ctl.hooks.BestCheckpoint()]",
        "ctl.hooks.BestCheckpoint.metric = 'held_out/loss'", eval_interval=LOOP)
    reference_dir, chaos_dir = str(tmp_path / "reference"), str(tmp_path / "chaos")
    with trainer(gin_file, reference_dir, str(tmp_path / "reference.steps")) as straight:
        killed, resumed = killed_and_resumed(tmp_path, gin_file, chaos_dir)
        finished(straight)
    assert_same_training(reference_dir, str(tmp_path / "reference.steps"), chaos_dir, killed,
                         resumed)
    evals = {d: ModelDir(d).metrics("eval") for d in (reference_dir, chaos_dir)}
    assert [r["step"] for r in evals[reference_dir]] == [LOOP, 2 * LOOP, STEPS]
    for record in evals[reference_dir]:  # Each set with the task's loss, metrics, aggregation.
        assert {"held_out/loss", "held_out/f1", "train/loss", "train/f1"} <= set(record), record
        # Each set read its own files: accuracies over 8 and 32 examples.
        assert (record["held_out/cls_accuracy"] * 8).is_integer(), record
        assert (record["train/cls_accuracy"] * 32).is_integer(), record
        assert record["held_out/loss"] != record["train/loss"]
    for name in ("held_out", "train"):
        assert set(scalars(os.path.join(reference_dir, "eval", name))["f1"]) == {3, 6, 9}
    # The killed run evaluated step 3, the restarted one 6 and 9: the numbers of the
    # uninterrupted run, and the same best checkpoint.
    chaos_by_step = {r["step"]: r for r in evals[chaos_dir]}
    for record in evals[reference_dir]:
        for key in ("held_out/loss", "held_out/f1", "train/loss"):
            assert chaos_by_step[record["step"]][key] == record[key], (record["step"], key)
    best = best_record(ModelDir(reference_dir))
    losses = {r["step"]: r["held_out/loss"] for r in evals[reference_dir]}
    assert best["metric"] == "held_out/loss" and best["step"] == min(losses, key=losses.get)
    assert best_record(ModelDir(chaos_dir))["step"] == best["step"]
    assert_bit_equal(*(os.path.join(d, "best", f"ckpt-{best['step']}", "ckpt")
                       for d in (reference_dir, chaos_dir)))


def test_dcn_kill_9_is_bit_identical(tmp_path):
    env = FAMILIES["ranking"][2]
    gin_file = write_gin(tmp_path, "ranking")
    reference_dir, chaos_dir = str(tmp_path / "reference"), str(tmp_path / "chaos")
    with trainer(gin_file, reference_dir, str(tmp_path / "reference.steps"), env=env) as straight:
        killed, resumed = killed_and_resumed(tmp_path, gin_file, chaos_dir, env=env)
        finished(straight)
    assert_same_training(reference_dir, str(tmp_path / "reference.steps"), chaos_dir, killed,
                         resumed)
    assert "auc" in ModelDir(chaos_dir).metrics("eval")[-1]
