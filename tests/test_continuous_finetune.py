"""Continuous fine-tuning's watcher (`ctl.sidecar.continuous_finetune`), in-process: real checkpoints
in a watched dir, a fine-tune that records what it was given and writes a checkpoint of its own.

Each checkpoint once, in number order, its step read from its `global_step`; a job started again
skips what is on record and goes on with a fine-tune begun (also when its checkpoint is gone); the
timeout ends the job only once `pretrain_steps` is reached; a watched path that is a file, or no
directory after the timeout, is one `UserError`. tests/test_model_garden_continuous_finetune.py runs
the whole command on a Model Garden experiment.
"""

import os
import threading
import time

import pytest
import tensorflow as tf

from ctl.model_dir import ModelDir
from ctl.sidecar.continuous_finetune import Finetuning, finetune_continuously
from ctl.sidecar.scheduler import ContinuousEval
from ctl.utils.errors import UserError

SETTINGS = ContinuousEval(timeout=0.5, poll_interval=0.01, settle_seconds=0.2)


def write_checkpoint(directory, number, step):
    """`directory/ckpt-<number>` holding `global_step` = `step`, as a pretraining run writes it."""
    checkpoint = tf.train.Checkpoint(global_step=tf.Variable(step, dtype=tf.int64))
    tf.train.CheckpointManager(checkpoint, str(directory), max_to_keep=None).save(
        checkpoint_number=number)


class Recorder:
    """The fine-tune: records (number, step, its dir's name), writes a checkpoint in its dir."""

    def __init__(self):
        self.calls = []

    def __call__(self, pretrained):
        self.calls.append((pretrained.number, pretrained.step,
                           os.path.basename(pretrained.directory.path)))
        write_checkpoint(pretrained.directory.path, 1, 1)
        return {"loss": float(pretrained.step)}


def job(tmp_path, recorder, pretrain_steps=None, reported=None):
    reported = [] if reported is None else reported
    finetuning = Finetuning(str(tmp_path / "pretraining"), bindings=lambda pretrained: [],
                            report=lambda pretrained, results: reported.append(
                                (pretrained.step, results)),
                            pretrain_steps=pretrain_steps)
    return finetune_continuously(ModelDir(str(tmp_path / "job")), finetuning, recorder, SETTINGS)


def test_each_checkpoint_once_in_order_and_a_restart_redoes_none(tmp_path):
    for number, step in ((2, 20), (1, 10)):
        write_checkpoint(tmp_path / "pretraining", number, step)
    recorder, reported = Recorder(), []
    assert job(tmp_path, recorder, reported=reported) == {"loss": 20.0}
    assert recorder.calls == [(1, 10, "ckpt-1"), (2, 20, "ckpt-2")]
    assert reported == [(10, {"loss": 10.0}), (20, {"loss": 20.0})]
    records = ModelDir(str(tmp_path / "job")).sidecar_evaluations()
    assert [(r["number"], r["step"], r["results"]) for r in records] == [
        (1, 10, {"loss": 10.0}), (2, 20, {"loss": 20.0})]
    again = Recorder()
    job(tmp_path, again)
    assert again.calls == []


def test_a_begun_fine_tune_goes_on_first_and_a_vanished_checkpoint_is_passed_over(tmp_path):
    pretraining = tmp_path / "pretraining"
    for number in (1, 2, 3):
        write_checkpoint(pretraining, number, number * 10)
    # A job killed in the fine-tune of ckpt-2, whose checkpoint the pretraining run deleted since,
    # as it did ckpt-1 (not begun).
    write_checkpoint(tmp_path / "job" / "finetune" / "ckpt-2", 1, 1)
    for number in (1, 2):
        for name in tf.io.gfile.glob(str(pretraining / f"ckpt-{number}.*")):
            os.remove(name)
    recorder = Recorder()
    job(tmp_path, recorder)
    # ckpt-2's step is its number once its checkpoint is gone.
    assert recorder.calls == [(2, 2, "ckpt-2"), (3, 30, "ckpt-3")]


def test_the_timeout_ends_the_job_only_once_pretrain_steps_is_reached(tmp_path):
    write_checkpoint(tmp_path / "pretraining", 1, 10)
    recorder = Recorder()

    def pretrain_on():  # The last checkpoint comes more than the timeout after the first fine-tune.
        while not ModelDir(str(tmp_path / "job")).sidecar_evaluations():
            time.sleep(0.01)
        time.sleep(3 * SETTINGS.timeout)
        write_checkpoint(tmp_path / "pretraining", 2, 20)

    thread = threading.Thread(target=pretrain_on)
    thread.start()
    job(tmp_path, recorder, pretrain_steps=20)
    thread.join()
    assert recorder.calls == [(1, 10, "ckpt-1"), (2, 20, "ckpt-2")]


def test_a_watched_path_that_is_no_directory_is_one_user_error(tmp_path):
    with pytest.raises(UserError, match="is not a directory after 0.5 s"):
        job(tmp_path, Recorder())
    (tmp_path / "pretraining").write_text("")
    with pytest.raises(UserError, match="is a file"):
        job(tmp_path, Recorder())
    assert not (tmp_path / "job").exists()
