"""The profiler hook, the HParams summary and `ctl.report` over several runs."""

import glob
import os

import gin
import pytest
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.plugins.hparams import metadata as hparams_metadata

import ctl
from tests.support.processes import run_ctl

RUN = """
import tests.tasks
ctl.Experiment.task = @RegressionTask()
RegressionTask.learning_rate = {learning_rate}
ctl.Schedule.train_steps = 40
ctl.Schedule.steps_per_loop = 5
ctl.Schedule.eval_interval = 20
ctl.Schedule.checkpoint_interval = 20
ctl.Experiment.hooks = [@ctl.hooks.Profile()]
ctl.hooks.Profile.start_step = 10
ctl.hooks.Profile.num_steps = 10
"""


def train(model_dir, learning_rate):
    gin.clear_config()
    gin.parse_config(RUN.format(learning_rate=learning_rate))
    return ctl.run_experiment("train_and_eval", str(model_dir))


def session_start_hparams(model_dir):
    """The HParams summary of `model_dir`, read with TensorBoard's own event reader."""
    accumulator = event_accumulator.EventAccumulator(str(model_dir))
    accumulator.Reload()
    content = accumulator.PluginTagToContent(hparams_metadata.PLUGIN_NAME)
    start = hparams_metadata.parse_session_start_info_plugin_data(
        content[hparams_metadata.SESSION_START_INFO_TAG])
    return {name: value.WhichOneof("kind") and getattr(value, value.WhichOneof("kind"))
            for name, value in start.hparams.items()}


def test_profile_trace_and_hparams_summary(tmp_path):
    train(tmp_path, learning_rate=0.1)
    # The profile: one run directory of trace files, in TensorBoard's layout for the `train` run.
    runs = glob.glob(os.path.join(tmp_path, "train", "plugins", "profile", "*"))
    assert len(runs) == 1, runs
    traces = glob.glob(os.path.join(runs[0], "*.xplane.pb"))
    assert traces
    # The file format's schema, as TensorFlow ships it (no API reads these files).
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    with open(traces[0], "rb") as f:
        space.ParseFromString(f.read())
    names = {m.name for plane in space.planes for m in plane.event_metadata.values()}
    assert any("loop_with_metrics" in name for name in names), sorted(names)[:50]

    hparams = session_start_hparams(tmp_path)
    assert hparams["RegressionTask.learning_rate"] == pytest.approx(0.1)
    # Integers as their text (TensorBoard would print 40.00), and how the run ended.
    assert hparams["Schedule.train_steps"] == "40"
    assert hparams["Profile.start_step"] == "10"
    assert hparams["Experiment.task"] == "@RegressionTask()"
    assert (hparams["state"], hparams["step"]) == ("complete", "40")


@pytest.mark.slow  # Starts a Python process (tests/support/tiers.py).
def test_report_compares_runs(tmp_path):
    for rate in (0.1, 0.02):
        train(tmp_path / f"lr{rate}", learning_rate=rate)
    result = run_ctl(f"--model_dir={tmp_path / 'lr0.1'}", f"--model_dir={tmp_path / 'lr0.02'}",
                     module="ctl.report")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    header = lines[1].split()
    assert header[:2] == ["run", "RegressionTask.learning_rate"]  # Only what differs.
    assert "eval/loss" in header and "Schedule.train_steps" not in header
    rows = {line.split()[0]: dict(zip(header, line.split())) for line in lines[3:5]}
    assert rows["lr0.1"]["RegressionTask.learning_rate"] == "0.1"
    assert float(rows["lr0.1"]["eval/loss"]) < float(rows["lr0.02"]["eval/loss"])
    assert rows["lr0.02"]["steps"] == "40"
    assert os.path.getsize(tmp_path / "report.png") > 10_000
