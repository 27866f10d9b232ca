"""Real clusters on 127.0.0.1 (`python -m ctl.launch`): multi-worker mirrored and parameter servers.

Each test starts its processes in a new session and kills that session in a
`finally`, so that no task outlives it. Runs are a few dozen steps of a tiny
model; the waits are generous because the machine is shared.
"""

import glob
import os
import re
import shutil

import pytest
import tensorflow as tf

import ctl
from ctl.config import gin_config as config
from ctl.model_dir import FINISHED_FILE
from tests.support.env import ROOT
from tests.support.processes import Process
from tests.support.reading import scalars

pytestmark = pytest.mark.slow

CLUSTER_GIN = os.path.join(ROOT, "tests", "cluster.gin")
TIMEOUT_S = 420
# Two workers add the same per-example gradients in a different order (an
# all-reduce), so their weights, and the eval results, agree up to float rounding.
RELATIVE_TOLERANCE = 1e-4


def launch(tmp_path, launch_args, run_args):
    """Runs `python -m ctl.launch`; returns (status, output, scratch dir of its tasks)."""
    scratch = tmp_path / "tmpdir"
    scratch.mkdir(exist_ok=True)
    # The launcher stops its tasks; finish() kills any it could not (the launcher's session).
    result = Process.ctl(*launch_args, f"--timeout_s={TIMEOUT_S}", "--", *run_args,
                         f"--gin_search_paths={ROOT}", module="ctl.launch",
                         env={"TMPDIR": str(scratch)}, merge_stderr=True).finish(TIMEOUT_S + 60)
    return result.returncode, result.stdout, str(scratch)


@pytest.fixture(scope="module")
def one_worker(tmp_path_factory):
    """Single-process train_and_eval runs of tests/cluster.gin, in this process.

    Returns the model dir and eval scalars of a run from scratch, and the eval
    scalars of a run resumed from its step-10 checkpoint (which reads the train
    set from its start again, so it differs from the run from scratch).
    """
    model_dir = str(tmp_path_factory.mktemp("one_worker"))
    resumed_dir = os.path.join(str(tmp_path_factory.mktemp("one_worker_resumed")), "model")
    config.parse([CLUSTER_GIN], [], [ROOT])
    ctl.run_experiment("train_and_eval", model_dir)
    copy_checkpoint(model_dir, 10, resumed_dir)
    ctl.run_experiment("train_and_eval", resumed_dir)
    return {"dir": model_dir, "evals": scalars(os.path.join(model_dir, "eval")),
            "resumed_evals": scalars(os.path.join(resumed_dir, "eval"))}


def copy_checkpoint(source_dir, step, model_dir):
    """Starts `model_dir` from `source_dir`'s checkpoint of `step`, as a resumed run."""
    os.makedirs(model_dir)
    for path in glob.glob(os.path.join(source_dir, f"ckpt-{step}.*")):
        shutil.copy(path, model_dir)
    with open(os.path.join(model_dir, "checkpoint"), "w") as f:
        f.write(f'model_checkpoint_path: "ckpt-{step}"\nall_model_checkpoint_paths: "ckpt-{step}"\n')


def assert_same_evals(actual, expected, steps):
    for tag in ("loss", "examples", "aggregated_examples", "auc", "score_sum"):
        for step in steps:
            assert actual[tag][step] == pytest.approx(expected[tag][step], rel=RELATIVE_TOLERANCE), (tag, step)
    assert actual["examples"][steps[-1]] == 9 and actual["aggregated_examples"][steps[-1]] == 9


def test_two_workers_resume_train_and_eval_like_one_worker(tmp_path, one_worker):
    # Both workers restore the chief's step-10 checkpoint of the one-worker run
    # (a worker that did not would train from other weights, and disagree).
    model_dir = str(tmp_path / "model")
    copy_checkpoint(one_worker["dir"], 10, model_dir)
    status, output, scratch = launch(
        tmp_path, ["--workers=2"],
        ["--mode=train_and_eval", "--strategy=multi_worker_mirrored", f"--model_dir={model_dir}",
         f"--gin_file={CLUSTER_GIN}", "--verbosity=0"])  # TensorFlow's INFO lines too.
    assert status == 0, output[-5000:]
    assert "group_size = 2" in output  # Both trained, together.
    assert re.search(rf"\[worker 1\] +ckpt \| step: +10 \| restored model from {model_dir}/ckpt-10",
                     output)
    # Each worker evaluated the whole eval set (9 examples, split over the two workers).
    assert_same_evals(scalars(os.path.join(model_dir, "eval")), one_worker["resumed_evals"], steps=[20])
    # Only the chief wrote to the model dir; worker 1 saved to a scratch dir it removed.
    # The chief's HParams summary is the one events file at the top (ctl.hooks.hparams).
    assert len(glob.glob(os.path.join(model_dir, "events.out.tfevents.*"))) == 1
    assert sorted(n for n in os.listdir(model_dir) if not n.startswith("events.out.")) == [
        "checkpoint", "ckpt-10.data-00000-of-00001", "ckpt-10.index", "ckpt-20.data-00000-of-00001",
        "ckpt-20.index", "config.gin", FINISHED_FILE, "eval", "metrics.jsonl",
        "operative_config.gin", "train", "trainer.lock"]
    events = glob.glob(os.path.join(model_dir, "*", "events.out.tfevents.*"))
    writers = {os.path.basename(path).split(".")[-3] for path in events}  # ...<host>.<pid>.<n>.v2
    assert {os.path.basename(os.path.dirname(p)) for p in events} == {"train", "eval"}
    assert len(writers) == 1, events  # One process, the chief, wrote every summary.
    assert re.search(rf"\[worker 1\] +ckpt \| step: +20 \| saved checkpoint to "
                     rf"{scratch}/ctl-worker-checkpoints-", output)
    assert glob.glob(os.path.join(scratch, "ctl-worker-*")) == []


def test_two_workers_and_an_evaluator_agree_with_one_worker(tmp_path, one_worker):
    model_dir = str(tmp_path / "model")
    status, output, _ = launch(
        tmp_path, ["--workers=2", "--evaluator"],
        ["--mode=train", "--strategy=multi_worker_mirrored", f"--model_dir={model_dir}",
         f"--gin_file={CLUSTER_GIN}"])
    assert status == 0, output[-5000:]
    assert "[evaluator] " in output
    assert_same_evals(scalars(os.path.join(model_dir, "eval")), one_worker["evals"], steps=[20])


def test_parameter_servers_train_to_the_target_step_beside_a_sidecar_evaluator(tmp_path):
    model_dir = str(tmp_path / "model")
    status, output, _ = launch(
        tmp_path, ["--workers=2", "--ps=1", "--evaluator"],
        ["--mode=train", "--strategy=parameter_server", f"--model_dir={model_dir}",
         f"--gin_file={CLUSTER_GIN}", "--gin_bindings=ctl.Schedule.train_steps=30"])
    assert status == 0, output[-5000:]
    checkpoint = tf.train.latest_checkpoint(model_dir)
    assert checkpoint.endswith("ckpt-30")
    assert tf.train.load_variable(checkpoint, "global_step/.ATTRIBUTES/VARIABLE_VALUE") == 30
    train = scalars(os.path.join(model_dir, "train"))
    assert set(train["loss"]) == {10, 20, 30} and train["loss"][30] < train["loss"][10]
    evals = scalars(os.path.join(model_dir, "eval"))
    assert 30 in evals["loss"] and evals["examples"][30] == 9 and evals["aggregated_examples"][30] == 9
