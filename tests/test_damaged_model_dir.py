"""The model dir's corruption policy in-process: train, eval and the sidecar on damaged model dirs.

A 20-step run (`trained_dir`) leaves ckpt-10 and ckpt-20; each case damages
a copy and runs again. Whatever the damage, the run restores the newest checkpoint
that restores and goes on to `train_steps`; it never starts from step 0 while a
checkpoint is there. (Two of these cases, and every checkpoint damaged, through
`python -m ctl.run` with their output and file hashes: tests/test_bad_inputs.py.)
"""

import os

import pytest
import tensorflow as tf

import ctl
from ctl.config import gin_config as config
from ctl.model_dir import ModelDir, read_json, write_atomically
from ctl.sidecar import continuous_eval
from ctl.sidecar.scheduler import ContinuousEval
from tests.support.env import TEST_GIN
from tests.support.reading import scalars, snapshot


def experiment(*bindings):
    config.parse([TEST_GIN], list(bindings))
    return config.call_configured(ctl.Experiment)


def copy_tree(source, target):
    """Copies the directory `source` to `target` (either may be in an object store)."""
    for directory, _, names in tf.io.gfile.walk(source):
        relative = os.path.relpath(directory, source)
        into = target if relative == "." else f"{target}/{relative}"  # No "./" in an object name.
        tf.io.gfile.makedirs(into)
        for name in names:
            tf.io.gfile.copy(os.path.join(directory, name), f"{into}/{name}", overwrite=True)


@pytest.fixture(params=["local", "gs"])
def run_dir(request, trained_dir, tmp_path):
    """A copy of the trained dir, on a local disk and in a bucket (a real GCS API)."""
    root = request.getfixturevalue("gcs_dir") if request.param == "gs" else str(tmp_path)
    model_dir = os.path.join(root, "run")
    copy_tree(trained_dir(), model_dir)
    return model_dir


def _names(model_dir):
    return [name.rstrip("/") for name in tf.io.gfile.listdir(model_dir)]


def _state(text: bytes, name="checkpoint"):
    def damage(model_dir):
        with tf.io.gfile.GFile(os.path.join(model_dir, name), "wb") as f:
            f.write(text)
    return damage


def _delete(number, *suffixes):
    def damage(model_dir):
        for name in _names(model_dir):
            if name.startswith(f"ckpt-{number}.") and name.endswith(suffixes or ("",)):
                tf.io.gfile.remove(os.path.join(model_dir, name))
    return damage


def _truncate(number, suffix):
    def damage(model_dir):
        for name in _names(model_dir):
            if name.startswith(f"ckpt-{number}.") and suffix in name:
                path = os.path.join(model_dir, name)
                with tf.io.gfile.GFile(path, "rb") as f:
                    data = f.read()
                with tf.io.gfile.GFile(path, "wb") as f:
                    f.write(data[:len(data) // 2])
    return damage


# damage -> the checkpoint the next run must restore.
DAMAGE = {
    "state file: text garbage": (_state(b"hello, this is not a checkpoint state\n"), 20),
    "state file: 0 bytes": (_state(b""), 20),
    "state file: not UTF-8": (_state(b"\xff\xfe\x00\x81model_checkpoint_path"), 20),
    "state file: missing": (lambda d: tf.io.gfile.remove(os.path.join(d, "checkpoint")), 20),
    "state file names a deleted checkpoint": (_delete(20), 10),
    "newest checkpoint's data truncated": (_truncate(20, ".data-"), 10),
    "newest checkpoint's index truncated": (_truncate(20, ".index"), 10),
    "newest index gone, data left": (_delete(20, ".index"), 10),
    "garbage state and newest truncated": (lambda d: (_state(b"\x00\x00")(d), _truncate(20, ".data-")(d)), 10),
    "run-finished marker cut short": (_state(b'{"final_st', name="ctl_run_finished.json"), 20),
}


# In a bucket, the cases that differ there: no rename, whole objects, `dir/` markers.
IN_A_BUCKET = {"state file: text garbage", "newest checkpoint's data truncated",
               "newest index gone, data left"}


@pytest.fixture
def damaged(request, run_dir):
    """`run_dir` with the test's `case` applied; the bucket runs only `IN_A_BUCKET`."""
    case = request.node.callspec.params["case"]
    if run_dir.startswith("gs://") and case not in IN_A_BUCKET:
        pytest.skip("covered on the local disk; in a bucket only the cases that differ there")
    DAMAGE[case][0](run_dir)
    return run_dir


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_train_restores_the_newest_checkpoint_that_restores(damaged, case):
    run_dir = damaged
    restored = DAMAGE[case][1]
    ctl.run_experiment("train", run_dir, experiment=experiment("ctl.Schedule.train_steps = 30"))
    # metrics.jsonl: the first run's loops, then this run's from the restored step on.
    steps = [r["step"] for r in ModelDir(run_dir).metrics("train")]
    assert steps == [10, 20] + list(range(restored + 10, 31, 10)), steps
    assert read_json(ModelDir(run_dir).finished_file)["final_step"] == 30
    # The state file is whole again and names the new checkpoint.
    state = ModelDir(run_dir).checkpoint_state()
    assert state.problem is None and state.latest.endswith("ckpt-30"), state


@pytest.mark.parametrize("case", ["state file: 0 bytes", "state file: not UTF-8",
                                  "state file names a deleted checkpoint",
                                  "newest checkpoint's data truncated"])
def test_eval_evaluates_the_newest_checkpoint_that_restores_and_writes_no_state(damaged, case):
    run_dir, restored = damaged, DAMAGE[case][1]
    state_file = os.path.join(run_dir, "checkpoint")
    before = {k: v for k, v in snapshot(run_dir).items() if k != "metrics.jsonl"}
    ctl.run_experiment("eval", run_dir, experiment=experiment())
    after = snapshot(run_dir)
    # Eval adds summaries and a metrics line; the checkpoints and the (damaged) state file
    # are untouched.
    assert {k: v for k, v in after.items()
            if not k.startswith("eval") and k != "metrics.jsonl"} == before
    assert list(scalars(os.path.join(run_dir, "eval"))["examples"]) == [restored], case
    assert tf.io.gfile.exists(state_file) == tf.io.gfile.exists(os.path.join(run_dir, "ckpt-10.index"))


def test_no_checkpoint_restores_is_an_error_not_a_fresh_start(run_dir):
    _truncate(20, ".data-")(run_dir)
    _truncate(10, ".index")(run_dir)
    before = snapshot(run_dir)
    with pytest.raises(ctl.UserError, match=r"no checkpoint in --model_dir=.* can be restored "
                       r"\(ckpt-20: .*; ckpt-10: .*\); delete the damaged files \(ckpt-20\.\*, "
                       r"ckpt-10\.\*\) to train from scratch"):
        ctl.run_experiment("train", run_dir, experiment=experiment("ctl.Schedule.train_steps = 30"))
    assert snapshot(run_dir) == before  # Refused before anything was written.
    # The fix the error suggests works: with the damaged files gone, training starts over.
    config.gin.clear_config()
    for name in _names(run_dir):
        if name.startswith(("ckpt-", "checkpoint")):
            tf.io.gfile.remove(os.path.join(run_dir, name))
    ctl.run_experiment("train", run_dir, experiment=experiment("ctl.Schedule.train_steps = 30"))
    assert sorted(ModelDir(run_dir).checkpoints()) == [10, 20, 30]


def test_sidecar_evaluates_every_checkpoint_despite_a_garbage_state_file(run_dir):
    write_atomically(os.path.join(run_dir, "checkpoint"), "garbage\n")
    _truncate(20, ".data-")(run_dir)
    settings = ContinuousEval(timeout=120, settle_seconds=0.0)
    # The trainer's final checkpoint (ckpt-20) is damaged: the sidecar says so, after ckpt-10.
    with pytest.raises(ctl.UserError, match=r"final checkpoint \(number 20\).*could not be "
                       r"evaluated \(failed\)"):
        continuous_eval.evaluate_continuously(ModelDir(run_dir), experiment=experiment(), settings=settings)
    records = ModelDir(run_dir).sidecar_evaluations()
    assert [r["number"] for r in records] == [10]
