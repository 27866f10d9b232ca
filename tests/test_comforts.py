"""Exporters, best checkpoint, hooks, early stopping, warm start, smoke mode, report, gin
comforts: through the CLI on real runs, plus the hook protocol, warm start and the report
in-process."""

import ctypes
import glob
import json
import os
import re
import shutil
import struct

import numpy as np
import pytest
import tensorflow as tf

import ctl
from ctl.hooks.best import best_record
from ctl.hooks.exporting import FinalExporter
from ctl.core.hook_protocol import Hook
from ctl.config import gin_config as config
from tests.support.env import ROOT
from tests.support.in_process import ctl_in_process
from tests.support.processes import run_ctl
from tests.support.reading import ctl_stderr_lines, exported, model_at, served, snapshot
from tests.support.strategies import mirrored
from ctl.model_dir import ModelDir
from tests.comfort_tasks import EncoderTask
from tests.tasks import RegressionTask, regression_data

COMFORTS_GIN = os.path.join(ROOT, "tests", "comforts.gin")
FEATURES, _ = regression_data(5, seed=3)


def one_error_line(result, *messages):
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr
    lines = ctl_stderr_lines(result.stderr)
    assert len(lines) == 1, result.stderr
    for message in messages:
        assert message in lines[0], lines[0]
    return lines[0]


# The tests that read `run_dir` run in one test process (an xdist group), so it runs once.
RUN_DIR = pytest.mark.xdist_group("comforts_run_dir")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """40 steps of train_and_eval with every exporter and the best checkpoint (the command's main
    in this process: its output and files are the command's)."""
    model_dir = str(tmp_path_factory.mktemp("comforts"))
    result = ctl_in_process("--mode=train_and_eval", f"--model_dir={model_dir}",
                            f"--gin_file={COMFORTS_GIN}")
    assert result.returncode == 0, result.stderr
    return model_dir, result.stdout


@pytest.mark.slow
@RUN_DIR
def test_exports_load_and_match_their_checkpoint(run_dir):
    model_dir, stdout = run_dir
    assert exported(model_dir, "latest") == [30, 40]  # max_to_keep=2 of 10, 20, 30, 40.
    assert exported(model_dir, "final") == [40]
    assert exported(model_dir, "best") == [40]  # Loss keeps falling; one kept.
    assert exported(model_dir, "checkpoint") == [10, 20, 30, 40]  # One per checkpoint saved.
    expected = model_at(os.path.join(model_dir, "ckpt-40"))(FEATURES).numpy()
    for name in ("latest", "final", "best", "checkpoint"):
        np.testing.assert_allclose(served(os.path.join(model_dir, "export", name, "40"), FEATURES),
                                   expected, rtol=1e-6, err_msg=name)
    assert not glob.glob(os.path.join(model_dir, "export", "*", ".tmp*"))  # Renamed into place.
    assert "export | step:     40 | final SavedModel" in stdout


@pytest.mark.slow
@RUN_DIR
def test_best_checkpoint_survives_restart_and_retention(run_dir, tmp_path):
    trained, _ = run_dir
    model_dir = str(tmp_path / "run")
    shutil.copytree(trained, model_dir)
    with open(os.path.join(model_dir, "best", "best.json")) as f:
        best = json.load(f)
    assert best["metric"] == "loss" and best["step"] == 40
    before = snapshot(os.path.join(model_dir, "best"))
    # Resume training toward zeros: every later evaluation is worse.
    result = ctl_in_process("--mode=train_and_eval", f"--model_dir={model_dir}",
                            f"--gin_file={COMFORTS_GIN}", "--gin.ctl.Schedule.train_steps=60",
                            "--gin.ctl.Experiment.trainer_cls=@ZeroTargetsTrainer")
    assert result.returncode == 0, result.stderr
    evals = ModelDir(model_dir).metrics("eval")
    assert [e["step"] for e in evals][-2:] == [50, 60]
    assert all(e["loss"] > best["value"] for e in evals[-2:])
    assert not os.path.exists(os.path.join(model_dir, "ckpt-40.index"))  # Retention ran...
    assert snapshot(os.path.join(model_dir, "best")) == before  # ...the best was kept as is.
    # BestExporter too: the latest exports moved on to the worse steps, the best stayed at 40.
    assert exported(model_dir, "latest") == [50, 60]
    assert exported(model_dir, "best") == [40]
    with open(os.path.join(model_dir, "export", "best", "best.json")) as f:
        assert json.load(f)["step"] == 40
    best_model = model_at(best["path"])
    np.testing.assert_allclose(best_model(FEATURES).numpy(),
                               model_at(os.path.join(trained, "ckpt-40"))(FEATURES).numpy())


@pytest.mark.slow
def test_early_stopping_stops_cleanly(tmp_path):
    # `examples` is 10 at every evaluation: never an improvement after the first.
    result = ctl_in_process("--mode=train_and_eval", f"--model_dir={tmp_path}",
                            f"--gin_file={COMFORTS_GIN}", "--gin.ctl.Schedule.train_steps=100",
                            "--gin.ctl.Experiment.hooks=[@ctl.hooks.EarlyStopping()]",
                            "--gin.ctl.hooks.EarlyStopping.metric='examples'",
                            "--gin.ctl.hooks.EarlyStopping.higher_is_better=True",
                            "--gin.ctl.hooks.EarlyStopping.patience=2")
    assert result.returncode == 0, result.stderr
    assert "early stopping: examples has not improved" in result.stdout
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-30")
    assert [r["step"] for r in ModelDir(str(tmp_path)).metrics("train")] == [10, 20, 30]
    # A restart remembers the stop: no more training.
    again = ctl_in_process("--mode=train_and_eval", f"--model_dir={tmp_path}",
                           f"--gin_file={COMFORTS_GIN}", "--gin.ctl.Schedule.train_steps=100",
                           "--gin.ctl.Experiment.hooks=[@ctl.hooks.EarlyStopping()]",
                           "--gin.ctl.hooks.EarlyStopping.metric='examples'",
                           "--gin.ctl.hooks.EarlyStopping.patience=2")
    assert again.returncode == 0, again.stderr
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-30")


@pytest.mark.slow
def test_warm_start_restores_a_subset_and_reports_it(tmp_path):
    encoder_args = ["--gin.ctl.Experiment.task=@EncoderTask()", "--gin.ctl.Experiment.hooks=[]"]
    pretrained = str(tmp_path / "pretrained")
    result = ctl_in_process("--mode=train", f"--model_dir={pretrained}", f"--gin_file={COMFORTS_GIN}",
                            "--gin.ctl.Schedule.train_steps=10", *encoder_args)
    assert result.returncode == 0, result.stderr
    warm = str(tmp_path / "warm")
    warm_args = [f"--model_dir={warm}", f"--gin_file={COMFORTS_GIN}",
                 "--gin.ctl.Experiment.task=@EncoderTask()",
                 "--gin.ctl.Experiment.hooks=[@ctl.hooks.WarmStart()]",
                 f"--gin.ctl.hooks.WarmStart.init_checkpoint='{pretrained}'",
                 "--gin.ctl.hooks.WarmStart.include=['encoder']"]
    result = ctl_in_process("--mode=train", "--gin.ctl.Schedule.train_steps=0", *warm_args)
    assert result.returncode == 0, result.stderr
    assert "restored 2 of 2 chosen variables (include=['encoder'])" in result.stdout
    assert "in the checkpoint but not restored" in result.stdout  # The head.
    source = model_at(os.path.join(pretrained, "ckpt-10"), EncoderTask())
    started = model_at(os.path.join(warm, "ckpt-0"), EncoderTask())
    for a, b in zip(source.get_layer("encoder").get_weights(),
                    started.get_layer("encoder").get_weights()):
        np.testing.assert_array_equal(a, b)
    assert not started.get_layer("head").get_weights()[0].any()  # Zero-initialized, not copied.
    assert source.get_layer("head").get_weights()[0].any()
    # Resuming the warm run uses its own checkpoint, not the pretrained one.
    result = ctl_in_process("--mode=train", "--gin.ctl.Schedule.train_steps=10", *warm_args)
    assert result.returncode == 0, result.stderr
    assert "warm start" not in result.stdout and "restored model from" in result.stdout
    # A checkpoint that provides none of the chosen variables is an error; nothing is written.
    fresh = tmp_path / "fresh"
    result = ctl_in_process("--mode=train", f"--model_dir={fresh}", f"--gin_file={COMFORTS_GIN}",
                            "--gin.ctl.Experiment.task=@EncoderTask()",
                            "--gin.ctl.Experiment.hooks=[@ctl.hooks.WarmStart()]",
                            f"--gin.ctl.hooks.WarmStart.init_checkpoint='{pretrained}'",
                            "--gin.ctl.hooks.WarmStart.checkpoint_prefix='encoder'")
    one_error_line(result, "matches none of the 4 chosen variables")
    assert not glob.glob(str(fresh / "ckpt-*"))


def test_warm_start_in_process_restores_the_included_layer_only(tmp_path):
    """`ctl.hooks.warm_start` on models built here: the encoder from the checkpoint, the head left
    as initialized and reported unread (the test above runs it through ctl.run's flags and gin)."""
    from ctl.hooks.warm_start import warm_start

    source = EncoderTask().build_model()
    source.get_layer("head").kernel.assign(tf.ones([4, 1]))
    tf.train.Checkpoint(model=source).save(str(tmp_path / "ckpt"))
    started = EncoderTask().build_model()
    report = warm_start(started, str(tmp_path), include=["encoder"])
    for a, b in zip(source.get_layer("encoder").get_weights(),
                    started.get_layer("encoder").get_weights()):
        np.testing.assert_array_equal(a, b)
    assert not started.get_layer("head").get_weights()[0].any()  # Zero-initialized, not copied.
    assert len(report["restored"]) == 2 and not report["not_in_checkpoint"]
    assert len(report["not_restored"]) == 2 and all(p.startswith("model/") for p in report["not_restored"])


def test_report_of_event_files_written_here_picks_the_best_by_the_metrics_name(tmp_path):
    """`ctl.report` on summaries written in this process: a loss is best at its minimum, an
    accuracy at its maximum (the test above runs the command on a run's model dir)."""
    from ctl import report

    model_dir = tmp_path / "run"
    for kind, tag, values in (("train", "loss", [3.0, 1.0, 2.0]), ("eval", "accuracy", [0.5, 0.9, 0.7])):
        writer = tf.summary.create_file_writer(str(model_dir / kind))
        with writer.as_default():
            for step, value in zip((10, 20, 30), values):
                tf.summary.scalar(tag, value, step=step)
        writer.close()
    text, png = report.report(str(model_dir), str(tmp_path / "curves.png"))
    rows = {tuple(line.split()[:2]): line.split()[2:] for line in text.splitlines()}
    assert rows[("train", "loss")] == ["2", "1", "20", "3"]  # Last, best, at step, points.
    assert rows[("eval", "accuracy")] == ["0.7", "0.9", "20", "3"]
    assert "steps: 30" in text
    with open(png, "rb") as f:
        assert f.read(4) == b"\x89PNG"


SHIPPED_CONFIGS = sorted(glob.glob(os.path.join(ROOT, "configs", "*.gin")))


@pytest.mark.slow
@pytest.mark.parametrize("gin_file", SHIPPED_CONFIGS, ids=os.path.basename)
def test_smoke_mode_passes_on_every_shipped_experiment(gin_file):
    result = ctl_in_process("--mode=smoke", f"--gin_file={gin_file}")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    assert "smoke | PASS" in result.stdout


def test_smoke_mode_fails_clearly_on_a_broken_config(tmp_path):
    # `python -m ctl.run`'s main in this process (one line on stderr, exit 2: the command's own
    # form, tests/test_bad_inputs.py).
    result = ctl_in_process("--mode=smoke", f"--gin_file={COMFORTS_GIN}",
                            "--gin.ctl.Experiment.task=@MisshapenTask()")
    line = one_error_line(result, "smoke test failed at train")
    assert "value 5" in line and "shape (8, 3)" in line  # The shapes that disagree.
    assert "Traceback" in result.stdout


@pytest.mark.slow
@RUN_DIR
def test_report_writes_a_table_and_a_png(run_dir, tmp_path):
    model_dir, _ = run_dir
    output = tmp_path / "curves.png"
    result = run_ctl(f"--model_dir={model_dir}", f"--output={output}", module="ctl.report")
    assert result.returncode == 0, result.stderr
    assert output.read_bytes().startswith(b"\x89PNG") and output.stat().st_size > 10_000
    rows = {tuple(line.split()[:2]): line.split() for line in result.stdout.splitlines()}
    assert rows[("eval", "loss")][-1] == "4"  # Four evaluations...
    assert rows[("train", "loss")][-2] == "40"  # ...and the best train loss at the last step.
    assert "steps: 40" in result.stdout
    assert "best checkpoint: loss" in result.stdout



@pytest.mark.slow
@RUN_DIR
def test_everyday_output(run_dir):
    model_dir, stdout = run_dir
    records = [json.loads(line) for line in open(os.path.join(model_dir, "metrics.jsonl"))]
    assert [(r["kind"], r["step"]) for r in records] == [
        (kind, step) for step in (10, 20, 30, 40) for kind in ("train", "eval")]
    assert "loss" in records[0] and "mae" in records[0] and records[-1]["examples"] == 10
    assert re.search(r"^train \| step: +40/40 \| loss: .* \| ETA 0:00:00$", stdout, re.M)


def test_misspelled_gin_name_lists_close_matches(tmp_path):
    result = ctl_in_process("--mode=train", f"--model_dir={tmp_path}", f"--gin_file={COMFORTS_GIN}",
                            "--gin.ctl.Schedule.train_stepz=3")
    one_error_line(result, "train_stepz", "did you mean train_steps?")
    assert os.listdir(tmp_path) == []


def test_misspelled_configurable_lists_close_matches():
    with pytest.raises(ctl.UserError, match="Did you mean RegressionTask"):
        config.parse([COMFORTS_GIN], ["ctl.Experiment.task = @RegresionTask()"])


class Recorder(Hook):
    """Records every call; requests a stop after `stop_after` train loops."""

    def __init__(self, stop_after=None):
        self.calls = []
        self.stop_after = stop_after

    def on_initialize(self):
        self.calls.append(("initialize",))

    def on_checkpoint_load(self, path):
        self.calls.append(("load", os.path.basename(path)))

    def on_train_loop_end(self, logs):
        self.calls.append(("train", self.run.step))
        if self.stop_after and self.run.step >= self.stop_after:
            self.run.stop.request("enough")

    def on_eval_end(self, logs):
        self.calls.append(("eval", self.run.step))

    def on_checkpoint_end(self, path):
        self.calls.append(("saved", os.path.basename(path)))

    def on_trial_close(self, logs):
        self.calls.append(("close", float(logs["examples"])))


def experiment(hooks, train_steps=30, task=None):
    return ctl.Experiment(task=task or RegressionTask(), hooks=hooks, schedule=ctl.Schedule(
        train_steps=train_steps, steps_per_loop=10, eval_interval=20, checkpoint_interval=20))


def test_hooks_are_called_in_order_and_a_stop_request_stops(tmp_path):
    first = Recorder()
    ctl.run_experiment("train_and_eval", str(tmp_path), experiment=experiment([first]))
    assert first.calls == [("initialize",), ("train", 10), ("train", 20), ("saved", "ckpt-20"),
                           ("eval", 20), ("train", 30), ("eval", 30), ("saved", "ckpt-30"),
                           ("close", 10.0)]
    second = Recorder(stop_after=40)
    ctl.run_experiment("train_and_eval", str(tmp_path), experiment=experiment([second], 100))
    assert second.calls == [("load", "ckpt-30"), ("train", 40), ("saved", "ckpt-40"),
                            ("eval", 40), ("close", 10.0)]


def test_export_under_mirrored_strategy_matches_the_model(tmp_path):
    exporter = FinalExporter()
    experiment_ = experiment([exporter], train_steps=20, task=RegressionTask("tf_keras"))
    ctl.run_experiment("train", str(tmp_path), strategy=mirrored(), experiment=experiment_)
    expected = model_at(os.path.join(tmp_path, "ckpt-20"), RegressionTask("tf_keras"))(FEATURES)
    np.testing.assert_allclose(served(os.path.join(tmp_path, "export", "final", "20"), FEATURES),
                               expected.numpy(), rtol=1e-6)


def test_a_hook_without_hook_methods_is_a_user_error(tmp_path):
    with pytest.raises(ctl.UserError, match="none of the hook methods"):
        ctl.run_experiment("train", str(tmp_path), experiment=experiment([object()]))


def test_keras_early_stopping_callback_stops_the_run(tmp_path, caplog):
    """It stops through ctl's stop request, and a warning names ctl's early stopping (the one route)."""
    import keras

    stopper = keras.callbacks.EarlyStopping(monitor="val_examples", mode="max", patience=1)
    hooks = [ctl.hooks.KerasCallbacks([stopper]), Recorder()]
    ctl.run_experiment("train_and_eval", str(tmp_path),
                       experiment=experiment(hooks, train_steps=200))
    evals = [call[1] for call in hooks[1].calls if call[0] == "eval"]
    assert evals == [20, 40]  # `val_examples` never improves after the first evaluation.
    assert stopper.stopped_epoch == 1
    said = [r.getMessage() for r in caplog.records if "ctl.hooks.EarlyStopping keeps the count" in r.getMessage()]
    assert said == ["EarlyStopping counts its patience in this process only (a restart starts it over); "
                    "ctl.hooks.EarlyStopping keeps the count in the model dir (docs/comforts.md)."]


def test_evaluator_side_hooks_export_and_track_the_evaluated_checkpoint(tmp_path):
    """`--mode=eval` (as a sidecar does): hooks act on the restored checkpoint."""
    ctl.run_experiment("train", str(tmp_path), experiment=experiment([], train_steps=20))
    hooks = [ctl.hooks.LatestExporter(), ctl.hooks.BestCheckpoint()]
    ctl.run_experiment("eval", str(tmp_path), experiment=experiment(hooks, train_steps=20))
    expected = model_at(os.path.join(tmp_path, "ckpt-20"))(FEATURES).numpy()
    np.testing.assert_allclose(served(os.path.join(tmp_path, "export", "latest", "20"), FEATURES),
                               expected, rtol=1e-6)
    record = best_record(ModelDir(str(tmp_path)))
    assert record["step"] == 20
    np.testing.assert_allclose(model_at(record["path"])(FEATURES).numpy(), expected, rtol=1e-6)


def test_sidecar_runs_the_eval_side_hooks_on_each_checkpoint(tmp_path):
    """continuous_eval exports and tracks the best of every checkpoint it evaluates."""
    ctl.run_experiment("train", str(tmp_path), experiment=experiment([], train_steps=40))
    hooks = [ctl.hooks.LatestExporter(), ctl.hooks.BestCheckpoint(), FinalExporter()]
    from ctl.sidecar import continuous_eval
    continuous_eval.evaluate_continuously(
        ModelDir(str(tmp_path)), experiment=experiment(hooks, train_steps=40),
        settings=ctl.ContinuousEval(timeout=60))
    assert exported(str(tmp_path), "latest") == [20, 40]
    assert not os.path.exists(os.path.join(tmp_path, "export", "final"))  # The trainer's job.
    expected = model_at(os.path.join(tmp_path, "ckpt-40"))(FEATURES).numpy()
    np.testing.assert_allclose(served(os.path.join(tmp_path, "export", "latest", "40"), FEATURES),
                               expected, rtol=1e-6)
    records = ModelDir(str(tmp_path)).sidecar_evaluations()
    assert [r["number"] for r in records] == [20, 40]
    best = min(records, key=lambda r: r["results"]["loss"])
    assert best["step"] == 40  # The loss falls: the later checkpoint is the better one.
    record = best_record(ModelDir(str(tmp_path)))
    assert (record["step"], record["value"]) == (40, pytest.approx(best["results"]["loss"]))


class ModelWatcher(Hook):
    """Records, at each checkpoint load and evaluation, the weights `run.model` and
    `run.eval_model` hold."""

    def __init__(self):
        self.loads, self.evals = [], []

    def _weights(self):
        return ([w.numpy() for w in self.run.model.weights],
                [w.numpy() for w in self.run.eval_model.weights])

    def on_checkpoint_load(self, path):
        self.loads.append((os.path.basename(path), *self._weights()))

    def on_eval_end(self, logs):
        self.evals.append((self.run.step, *self._weights()))


def average_at(path):
    """RegressionTask's model with the moving average (`ema/model`) of the checkpoint at `path`."""
    model = RegressionTask().build_model()
    tf.train.Checkpoint(ema=tf.train.Checkpoint(model=model)).read(path).expect_partial()
    return model


def as_bytes(values):
    return sorted(np.asarray(v).tobytes() for v in values)


def test_the_sidecars_hooks_see_the_run_in_line_hooks_see_and_each_checkpoint_load(tmp_path):
    """One wiring: with a moving average, `run.model` is the trained model and `run.eval_model`
    the average, in-line and on the sidecar, whose every checkpoint calls `on_checkpoint_load`."""
    config.parse([], ["ctl.Trainer.ema_decay = 0.8"])
    inline = ModelWatcher()
    ctl.run_experiment("train_and_eval", str(tmp_path), experiment=experiment([inline], 40))
    sidecar = ModelWatcher()
    from ctl.sidecar import continuous_eval
    continuous_eval.evaluate_continuously(
        ModelDir(str(tmp_path)), experiment=experiment([sidecar], 40),
        settings=ctl.ContinuousEval(timeout=60))
    assert [load[0] for load in sidecar.loads] == ["ckpt-20", "ckpt-40"]
    assert [evaluation[0] for evaluation in sidecar.evals] == [20, 40]
    for name, model, eval_model in sidecar.loads:
        path = os.path.join(tmp_path, name)
        assert as_bytes(model) == as_bytes(model_at(path).weights)
        assert as_bytes(eval_model) == as_bytes(average_at(path).weights)
        assert as_bytes(model) != as_bytes(eval_model)  # A real average.
    # In-line, at step 40 (its last evaluation and checkpoint): the same two models.
    step, model, eval_model = inline.evals[-1]
    assert step == 40 and [e[0] for e in sidecar.evals][-1] == 40
    assert as_bytes(model) == as_bytes(sidecar.evals[-1][1])
    assert as_bytes(eval_model) == as_bytes(sidecar.evals[-1][2])


def test_metrics_jsonl_goes_on_after_a_line_a_kill_cut_short(tmp_path):
    """metrics.jsonl and the sidecar's eval/metrics.jsonl share one writer (`JsonLines`): the first
    line after a restart starts on a line of its own, so the cut line alone is lost."""
    with open(tmp_path / "metrics.jsonl", "w") as f:
        f.write('{"kind": "train", "step": 10, "time": 1.0, "loss": 0.5}\n{"kind": "train", "st')
    ctl.run_experiment("train", str(tmp_path), experiment=experiment([], train_steps=20))
    from ctl.model_dir import read_json_lines
    records = read_json_lines(str(tmp_path / "metrics.jsonl"))
    assert [(r["kind"], r["step"]) for r in records] == [("train", 10), ("train", 10), ("train", 20)]


def test_hooks_name_a_named_eval_sets_metric_as_set_slash_name():
    from ctl.hooks.eval_results import metric_value
    from ctl.hooks.progress import scalars

    logs = {"clean": {"loss": np.float32(0.5), "accuracy": np.float32(0.75)},
            "noisy": {"loss": tf.constant(1.5), "accuracy": 0.25}, "steps_per_second": 10.0}
    assert metric_value(logs, "noisy/accuracy", "ctl.hooks.BestCheckpoint") == 0.25
    assert scalars(logs) == {"clean/loss": 0.5, "clean/accuracy": 0.75, "noisy/loss": 1.5,
                             "noisy/accuracy": 0.25, "steps_per_second": 10.0}
    with pytest.raises(ctl.UserError, match=r"'accuracy' is not among the evaluation results "
                       r"\(clean/accuracy, clean/loss, noisy/accuracy, noisy/loss, steps_per"):
        metric_value(logs, "accuracy", "ctl.hooks.BestCheckpoint")


def test_best_trackers_write_nothing_until_there_is_a_best(tmp_path):
    """Why ctl keeps its own BestMetric (docs/explanation/architecture.md): orbit's `NewBestMetric` and
    `JSONPersistedValue` write their file as soon as they are built, so binding a
    hook to a model dir that is then refused would leave a file behind, and their
    record holds only the value, not the step and path that BestExporter,
    BestCheckpoint and `ctl.report` need."""
    step = tf.Variable(7, dtype=tf.int64)
    run = ctl.hooks.Run(directory=ModelDir(str(tmp_path)), model=None, checkpoint=tf.train.Checkpoint(step=step),
                  global_step=step)
    best_checkpoint, best_exporter = ctl.hooks.BestCheckpoint(), ctl.hooks.BestExporter()
    for hook in (best_checkpoint, best_exporter):
        hook.bind(run)
    assert os.listdir(tmp_path) == []
    best_checkpoint.on_eval_end({"loss": np.float32(0.5)})
    record = best_record(ModelDir(str(tmp_path)))
    assert (record["value"], record["step"]) == (0.5, 7)
    assert tf.train.load_checkpoint(record["path"]).get_tensor(
        "step/.ATTRIBUTES/VARIABLE_VALUE") == 7


class DirectoryEvents:
    """The entries created in, or renamed into, one local directory, as Linux's inotify
    queues them: every event, in order, none missed (no polling)."""

    CREATE, MOVED_TO, NONBLOCK = 0x100, 0x80, 0o4000

    def __init__(self, directory):
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self.libc.inotify_init1(self.NONBLOCK)
        assert self.fd >= 0, os.strerror(ctypes.get_errno())
        watch = self.libc.inotify_add_watch(self.fd, os.fsencode(directory),
                                            self.CREATE | self.MOVED_TO)
        assert watch >= 0, os.strerror(ctypes.get_errno())

    def read(self):
        """[(name, "created" or "renamed in")] since the last read."""
        events, data = [], b""
        while True:
            try:
                data += os.read(self.fd, 65536)
            except BlockingIOError:
                break
        while data:
            _, mask, _, length = struct.unpack_from("iIII", data)
            name = data[16:16 + length].rstrip(b"\0").decode()
            events.append((name, "created" if mask & self.CREATE else "renamed in"))
            data = data[16 + length:]
        return events

    def close(self):
        os.close(self.fd)


def test_an_export_appears_whole_and_once_per_step(tmp_path):
    """Why ctl keeps its own exporter (docs/explanation/architecture.md): orbit's `ExportSavedModel` writes
    into the final directory (a reader or a crash can see half a SavedModel) and, on
    a restart, exports the same step again under the next counter."""
    parent = os.path.join(tmp_path, "export", "latest")
    final_dir = os.path.join(parent, "3")
    task = RegressionTask()
    step = tf.Variable(3, dtype=tf.int64)
    model = task.build_model()
    run = ctl.hooks.Run(directory=ModelDir(str(tmp_path)), model=model, checkpoint=None, global_step=step,
                  task=task)
    os.makedirs(parent)
    events = DirectoryEvents(parent)
    try:
        for _ in range(2):  # The second: a restart that evaluates the same step again.
            exporter = ctl.hooks.LatestExporter()
            exporter.bind(run)
            exporter.on_eval_end({})
        seen = events.read()
    finally:
        events.close()
    # The step's directory appeared once, by a rename of a whole SavedModel: it was never
    # created in place, where a reader could see it half written.
    assert [event for event in seen if event[0] == "3"] == [("3", "renamed in")], seen
    assert exported(str(tmp_path), "latest") == [3]
    assert not glob.glob(os.path.join(tmp_path, "export", "latest", ".tmp*"))
    np.testing.assert_allclose(served(final_dir, FEATURES), model(FEATURES).numpy(), rtol=1e-5)
