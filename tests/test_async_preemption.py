"""A signal while an asynchronous checkpoint is still being written (`ctl.Schedule.async_checkpointing`).

The exit-75 message names a checkpoint; the `checkpoint` state file must name the same one
when the process is gone, so that a restart restores it and no step is lost. The save is made
slow enough to overlap the signal: on a local dir by a 96 MiB frozen weight in the checkpoint
(TensorFlow's async writer is still writing it when the preemption save comes), on `gs://`
(tests/gcs) by 300 ms added to every request (the checkpoint's upload is still running).
"""

import signal

import pytest
import tensorflow as tf

from ctl.core.stop import EXIT_PREEMPTED
from tests.support.probe import read_steps, run_to_end, Trainer
from tests.support.reading import ctl_stderr_lines

pytestmark = pytest.mark.slow
# Host loops of 200 steps: the signal stops the loop of steps 201-400 a few steps in, while
# ckpt-200 is still being written.
ASYNC = ("ctl.Schedule.async_checkpointing=True", "ctl.Trainer.use_tf_while_loop=False",
         "ctl.Schedule.steps_per_loop=200", "ctl.Schedule.checkpoint_interval=200")


@pytest.mark.parametrize("store", ["local", "gcs"])
def test_a_signal_during_an_async_save_names_the_checkpoint_a_restart_restores(request, tmp_path, store):
    progress = str(tmp_path / "progress")
    if store == "gcs":
        gcs = request.getfixturevalue("gcs")
        model_dir = request.getfixturevalue("gcs_dir")
        bindings = (*ASYNC, "ProbeTask.ballast_kb=1024")
        gcs.set_latency(300)
    else:
        model_dir = str(tmp_path / "run")
        bindings = (*ASYNC, "ProbeTask.ballast_kb=98304")
    with Trainer(model_dir, progress, *bindings, "ctl.Schedule.train_steps=1000000") as trainer:
        # Step 201 started: the loop of steps 1-200 ended and its checkpoint is being written.
        assert trainer.wait_for_step(201, timeout=240), trainer.finish().stderr
        trainer.proc.send_signal(signal.SIGTERM)
        result = trainer.finish(timeout=240)
    if store == "gcs":
        gcs.set_latency(0)
    assert result.returncode == EXIT_PREEMPTED, result.stderr
    line = ctl_stderr_lines(result.stderr)[-1]
    assert line.startswith("ctl.run: preempted: stopped by SIGTERM"), result.stderr
    named = line.split("checkpoint ", 1)[1].split(" ", 1)[0]
    assert named != f"{model_dir}/ckpt-200", line  # The signal came before the loop's end.
    assert tf.train.latest_checkpoint(model_dir) == named, line
    saved = int(named.rsplit("-", 1)[1])
    assert read_steps(progress) == list(range(1, saved + 1))  # Every step started is in it.

    run_to_end(model_dir, progress, *bindings, f"ctl.Schedule.train_steps={saved + 10}")
    assert read_steps(progress) == list(range(1, saved + 11))  # Resumed at saved + 1.
