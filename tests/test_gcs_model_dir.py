"""A model dir in an object store: every mode and every eval-side file on a real GCS API.

The `gcs` fixture (tests/conftest.py, tests/gcs) serves a GCS emulator as Google's
hosts (an HTTPS proxy, over TLS) on 127.0.0.1; TensorFlow's own `gs://` filesystem talks to it. Nothing
here reads the model dir but through `tf.io.gfile`, as ctl must.
"""

import json
import os
import signal
import time

import numpy as np
import pytest
import tensorflow as tf

from ctl.hooks.best import BEST_DIR, BEST_RECORD_FILE
from ctl.hooks.early_stopping import EARLY_STOPPING_FILE
from ctl.model_dir.trainer_lock import TRAINER_LOCK_FILE
from ctl.model_dir import EVAL_DIR
from ctl.model_dir.sidecar_progress import SIDECAR_PROGRESS_FILE
from ctl.model_dir import PUBLISHED_MARKER, ModelDir, read_json, read_json_lines
from tests.support.env import ROOT
from tests.support.in_process import ctl_in_process, run_ctl_in_process
from tests.support.processes import Process, run_ctl
from tests.support.reading import checkpoint_values, ctl_stderr_lines

COMFORTS_GIN = os.path.join(ROOT, "tests", "comforts.gin")
WAIT_S = 300

pytestmark = pytest.mark.slow


def listing(path):
    return sorted(name.rstrip("/") for name in tf.io.gfile.listdir(path)) \
        if tf.io.gfile.isdir(path) else []


def published(path):
    return tf.io.gfile.exists(f"{path}/{PUBLISHED_MARKER}")


def markers(model_dir):
    """pid of the process that published each export and best checkpoint."""
    owners = {}
    for root in (f"{model_dir}/export/latest", f"{model_dir}/export/best", f"{model_dir}/best"):
        for name in listing(root):
            record = read_json(f"{root}/{name}/{PUBLISHED_MARKER}")
            if record:
                owners[f"{root}/{name}"] = record["pid"]
    return owners


def test_every_mode_runs_on_gs(gcs_dir, tmp_path):
    model_dir = f"{gcs_dir}/run"
    # Every mode runs ctl.run's main in this process (a TensorFlow import less each): what runs on
    # gs:// is the same code; a process of its own on gs:// is every other test of this file's.
    trained = ctl_in_process("--mode=train_and_eval", f"--model_dir={model_dir}",
                             f"--gin_file={COMFORTS_GIN}")
    assert trained.returncode == 0, trained.stderr[-3000:]
    directory = ModelDir(model_dir)
    assert sorted(directory.checkpoints()) == [40]
    values = checkpoint_values(f"{model_dir}/ckpt-40")
    assert values and all(v is None or np.all(np.isfinite(v)) for v in values.values())
    assert [r["step"] for r in read_json_lines(directory.metrics_file) if r["kind"] == "eval"] \
        == [10, 20, 30, 40]
    for name, steps in (("latest", ["30", "40"]), ("final", ["40"]), ("checkpoint", ["40"])):
        assert listing(f"{model_dir}/export/{name}")[-len(steps):] == steps, name
        assert all(published(f"{model_dir}/export/{name}/{s}") for s in steps), name
    best = read_json(directory.file(BEST_DIR, BEST_RECORD_FILE))
    assert best["step"] == 40 and published(os.path.dirname(best["path"]))
    served = tf.saved_model.load(f"{model_dir}/export/final/40")
    assert "serving_default" in served.signatures

    # The sidecar reads the trainer's config.gin from the bucket (no --gin_file).
    sidecar = ctl_in_process("--mode=continuous_eval", f"--model_dir={model_dir}")
    assert sidecar.returncode == 0, sidecar.stderr[-3000:]
    records = read_json_lines(directory.sidecar_metrics_file)
    assert [r["number"] for r in records] == [40]
    assert read_json(directory.file(EVAL_DIR, SIDECAR_PROGRESS_FILE))

    code, _, err = run_ctl_in_process(["--mode=eval", f"--model_dir={model_dir}",
                                       f"--gin_file={COMFORTS_GIN}"])
    assert code == 0, err[-3000:]

    # A --gin_file in the bucket, too, and smoke mode with a gs:// model dir.
    gin_copy = f"{gcs_dir}/configs/comforts.gin"
    tf.io.gfile.makedirs(os.path.dirname(gin_copy))
    tf.io.gfile.copy(COMFORTS_GIN, gin_copy)
    code, _, err = run_ctl_in_process(["--mode=smoke", f"--model_dir={gcs_dir}/smoke",
                                       f"--gin_file={gin_copy}"])
    assert code == 0, err[-3000:]

    report = run_ctl(f"--model_dir={model_dir}", module="ctl.report", timeout=WAIT_S)
    assert report.returncode == 0, report.stderr[-3000:]
    assert f"curves: {model_dir}/report.png" in report.stdout
    assert tf.io.gfile.stat(f"{model_dir}/report.png").length > 1000


def _training(process: Process, model_dir: str) -> None:
    """Waits until `process` trains in `model_dir`: its first checkpoint is there (its lease taken)."""
    assert process.wait_until(lambda: bool(ModelDir(model_dir).checkpoints()), WAIT_S, 0.5), \
        process.stderr()[-3000:]


def test_a_second_trainer_on_the_same_bucket_dir_is_refused(gcs_dir):
    model_dir = f"{gcs_dir}/run"
    with Process.ctl("--mode=train", f"--model_dir={model_dir}", f"--gin_file={COMFORTS_GIN}",
                    "--gin_bindings=ctl.Schedule.train_steps=100000",
                    "--gin_bindings=ctl.Experiment.hooks=[]") as first:
        _training(first, model_dir)
        second = run_ctl("--mode=train", f"--model_dir={model_dir}", f"--gin_file={COMFORTS_GIN}",
                         timeout=WAIT_S)
        assert second.returncode == 2, second.stderr[-3000:]
        lines = ctl_stderr_lines(second.stderr)
        assert len(lines) == 1, lines
        [line] = lines
        assert "is in use by another trainer" in line and f"pid {first.proc.pid}" in line, line
        first.proc.send_signal(signal.SIGTERM)
        stopped = first.finish(timeout=WAIT_S)
    assert stopped.returncode == 75, stopped.stderr[-3000:]
    assert not tf.io.gfile.exists(ModelDir(model_dir).file(TRAINER_LOCK_FILE))  # Released.


def test_a_trainer_whose_bucket_lease_is_taken_stops_before_its_next_checkpoint(gcs_dir):
    """Another trainer's record replaces this trainer's lease (as after a freeze longer than
    the staleness window): at its next loop end it stops, saves nothing more, says so in one
    line and exits 2; the other's record stays."""
    model_dir = f"{gcs_dir}/run"
    lock_file = ModelDir(model_dir).file(TRAINER_LOCK_FILE)
    with Process.ctl("--mode=train", f"--model_dir={model_dir}", f"--gin_file={COMFORTS_GIN}",
                    "--gin_bindings=ctl.Schedule.train_steps=1000000",
                    "--gin_bindings=ctl.Schedule.max_checkpoints=100",
                    "--gin_bindings=ctl.Experiment.hooks=[]") as trainer:
        _training(trainer, model_dir)
        theirs = {"role": "trainer", "pid": 4242, "host": "elsewhere", "token": "theirs",
                  "renewed": time.time(), "since": "2026-11-26T00:00:00Z"}
        with tf.io.gfile.GFile(lock_file, "w") as f:
            f.write(json.dumps(theirs))
        stopped = trainer.finish(timeout=120)  # It stops within a renewal and a loop.
    stderr = stopped.stderr
    assert stopped.returncode == 2, stderr[-3000:]
    lines = ctl_stderr_lines(stderr)
    assert len(lines) == 1 and "was taken by another trainer (pid 4242 on host elsewhere" in lines[0], lines
    stopped = int(lines[0].split("stopped after step ")[1].split()[0])
    assert max(ModelDir(model_dir).checkpoints()) < stopped  # Nothing saved at the stop.
    assert read_json(lock_file)["token"] == "theirs"


def test_a_sidecar_killed_during_an_export_leaves_no_published_half_and_finishes_it(gcs, gcs_dir):
    """The sidecar's export of ckpt-10 is held mid-publish (the bucket answers 503 to its
    `saved_model.pb`, copied last) and the sidecar is killed there; its restart publishes it."""
    model_dir = f"{gcs_dir}/run"
    exporter = ["--gin_bindings=ctl.Experiment.hooks=[@ctl.hooks.LatestExporter()]",
                "--gin_bindings=ctl.Schedule.max_checkpoints=5"]
    # The trainer, and the sidecar's restart below, run the command's main in this process; the
    # sidecar that is killed is a process.
    trained = ctl_in_process("--mode=train", f"--model_dir={model_dir}", f"--gin_file={COMFORTS_GIN}",
                             "--gin_bindings=ctl.Schedule.train_steps=20", *exporter)
    assert trained.returncode == 0, trained.stderr[-3000:]
    export = f"{model_dir}/export/latest"
    gcs.inject_faults([{"path_contains": "export%2Flatest%2F10%2Fsaved_model.pb", "status": 503}])
    with Process.ctl("--mode=continuous_eval", f"--model_dir={model_dir}") as sidecar:
        # Copying, saved_model.pb held by the bucket.
        assert sidecar.wait_until(lambda: "variables" in listing(f"{export}/10"), WAIT_S, 0.2), \
            sidecar.stderr()[-3000:]
        time.sleep(1)
    # Killed (SIGKILL) on the way out of the block.
    assert sidecar.proc.returncode == -signal.SIGKILL
    assert not published(f"{export}/10")
    assert "saved_model.pb" not in listing(f"{export}/10")  # No reader would load it.
    assert not read_json_lines(ModelDir(model_dir).sidecar_metrics_file)  # Not recorded as done.

    gcs.reset()
    restarted = ctl_in_process("--mode=continuous_eval", f"--model_dir={model_dir}")
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    assert [r["number"] for r in read_json_lines(ModelDir(model_dir).sidecar_metrics_file)] == [10, 20]
    assert listing(export) == ["10", "20"] and all(published(f"{export}/{s}") for s in ("10", "20"))
    assert "serving_default" in tf.saved_model.load(f"{export}/10").signatures


def test_warm_start_early_stopping_hparams_and_a_profile_in_the_bucket(gcs_dir):
    """One train_and_eval in the bucket, warm started from a checkpoint in the bucket, with
    EarlyStopping, the HParams summary and a `ctl.hooks.Profile` trace: each reads or
    writes its files there."""
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.plugins.hparams import metadata as hparams_metadata
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    from tests.comfort_tasks import EncoderTask

    pretrained = EncoderTask().build_model()
    encoder = [np.full(w.shape, 0.25 + i, np.float32)
               for i, w in enumerate(pretrained.get_layer("encoder").get_weights())]
    pretrained.get_layer("encoder").set_weights(encoder)
    tf.train.CheckpointManager(tf.train.Checkpoint(model=pretrained), f"{gcs_dir}/pretrained",
                               max_to_keep=1).save(checkpoint_number=10)
    model_dir = f"{gcs_dir}/run"
    run = run_ctl(
        "--mode=train_and_eval", f"--model_dir={model_dir}", f"--gin_file={COMFORTS_GIN}",
        "--gin.ctl.Experiment.task=@EncoderTask()", "--gin.RegressionTask.learning_rate=0.0",
        "--gin.ctl.Schedule.train_steps=100",
        "--gin.ctl.Experiment.hooks=[@ctl.hooks.WarmStart(), @ctl.hooks.EarlyStopping(), "
        "@ctl.hooks.Profile()]",
        f"--gin.ctl.hooks.WarmStart.init_checkpoint='{gcs_dir}/pretrained'",
        "--gin.ctl.hooks.WarmStart.include=['encoder']",
        # `examples` is 10 at every evaluation: no improvement after the first.
        "--gin.ctl.hooks.EarlyStopping.metric='examples'",
        "--gin.ctl.hooks.EarlyStopping.higher_is_better=True",
        "--gin.ctl.hooks.EarlyStopping.patience=2",
        "--gin.ctl.hooks.Profile.start_step=10", "--gin.ctl.hooks.Profile.num_steps=10",
        timeout=WAIT_S)
    assert run.returncode == 0, run.stderr[-3000:]
    directory = ModelDir(model_dir)

    # Warm start: the encoder came from the bucket's checkpoint (learning rate 0 keeps it).
    assert "restored 2 of 2 chosen variables (include=['encoder'])" in run.stdout, run.stdout
    assert sorted(directory.checkpoints()) == [30]
    started = EncoderTask().build_model()
    tf.train.Checkpoint(model=started).read(f"{model_dir}/ckpt-30").expect_partial()
    for want, got in zip(encoder, started.get_layer("encoder").get_weights()):
        np.testing.assert_array_equal(want, got)

    # Early stopping: stopped after two evaluations without improvement, its record in the bucket.
    assert "early stopping: examples has not improved" in run.stdout
    assert read_json(directory.file(EARLY_STOPPING_FILE)) == {
        "metric": "examples", "best": 10.0, "evaluations_without_improvement": 2, "step": 30}

    # HParams: the operative values, read from the bucket with TensorBoard's own reader.
    accumulator = event_accumulator.EventAccumulator(model_dir)
    accumulator.Reload()
    content = accumulator.PluginTagToContent(hparams_metadata.PLUGIN_NAME)
    start = hparams_metadata.parse_session_start_info_plugin_data(
        content[hparams_metadata.SESSION_START_INFO_TAG])
    hparams = {name: getattr(value, value.WhichOneof("kind"))
               for name, value in start.hparams.items()}
    assert hparams["Experiment.task"] == "@EncoderTask()"
    # Integers as their text (TensorBoard's table has no integer type: 2, not 2.0).
    assert hparams["EarlyStopping.patience"] == "2" and hparams["Profile.start_step"] == "10"

    # The profile: one trace run under train/plugins/profile, with the train loop's ops in it.
    [profile_run] = listing(f"{model_dir}/train/plugins/profile")
    [trace] = tf.io.gfile.glob(f"{model_dir}/train/plugins/profile/{profile_run}/*.xplane.pb")
    space = xplane_pb2.XSpace()
    with tf.io.gfile.GFile(trace, "rb") as f:
        space.ParseFromString(f.read())
    names = {m.name for plane in space.planes for m in plane.event_metadata.values()}
    assert any("loop_with_metrics" in name for name in names), sorted(names)[:50]


def test_in_line_evaluation_in_a_bucket_reads_the_sidecar_announcement_ahead_off_the_training_thread(
        gcs_dir, monkeypatch):
    # A read is two requests there: each evaluation decides by the read started right after the
    # previous decision, on a thread of its own (the first one reads on the caller's thread),
    # so a sidecar's coming and going is seen one evaluation later.
    import threading

    from ctl.model_dir.evaluator_role import SIDECAR, TRAINER, EvaluatorRole
    from ctl.model_dir import ModelDir
    readers = []
    read = EvaluatorRole.live_sidecar

    def live_sidecar(role):
        sidecar = read(role)
        readers.append((threading.current_thread().name, bool(sidecar)))
        return sidecar

    def reads_done(count):
        deadline = time.monotonic() + 60
        while len(readers) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        return len(readers) >= count

    monkeypatch.setattr(EvaluatorRole, "live_sidecar", live_sidecar)
    trainer = EvaluatorRole(ModelDir(gcs_dir), TRAINER)
    sidecar = EvaluatorRole(ModelDir(gcs_dir), SIDECAR)
    sidecar.announce()
    try:
        assert trainer.steps_aside(500) and trainer.steps_aside(1000)
        assert reads_done(3)  # The read for the third evaluation saw the announcement.
    finally:
        sidecar.release()
    assert trainer.steps_aside(1500)  # One evaluation late.
    assert not trainer.steps_aside(2000)
    assert readers[0] == (threading.current_thread().name, True)
    # The fifth read, for a next evaluation, may still run.
    assert readers[1:4] == [("ctl-sidecar-read", True)] * 2 + [("ctl-sidecar-read", False)]


def test_a_trainer_reads_the_first_evaluations_announcement_ahead(gcs_dir, monkeypatch):
    # As its run starts (`EvaluatorRole.read_ahead`, train_lib): the first in-line evaluation's
    # decision then waits for no read on the training thread.
    import threading

    from ctl.model_dir.evaluator_role import TRAINER, EvaluatorRole
    from ctl.model_dir import ModelDir
    readers = []
    read = EvaluatorRole.live_sidecar

    def live_sidecar(role):
        readers.append(threading.current_thread().name)
        return read(role)

    monkeypatch.setattr(EvaluatorRole, "live_sidecar", live_sidecar)
    trainer = EvaluatorRole(ModelDir(gcs_dir), TRAINER)
    trainer.read_ahead()
    assert not trainer.steps_aside(500)
    assert readers[0] == "ctl-sidecar-read"
