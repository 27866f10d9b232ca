"""A signal while an asynchronous checkpoint is still being written (`ctl.Schedule.async_checkpointing`).

The exit-75 message names a checkpoint; the `checkpoint` state file must name the same one
when the process is gone, so that a restart restores it and no step is lost. The save is made
slow enough to overlap the signal by the model dir's store: `gs://` (tests/gcs) with 300 ms
added to every request, and a 1 MiB frozen weight in the checkpoint.
"""

import signal

import pytest
import tensorflow as tf

from ctl.faults.preemption import EXIT_PREEMPTED
from tests.cli import ctl_stderr_lines
from tests.test_faults_processes import Trainer, read_steps, run_to_end

pytestmark = pytest.mark.slow
# Host loops of 200 steps: the signal stops the loop of steps 201-400 a few steps in, while
# ckpt-200 is still being written.
ASYNC = ("ctl.Schedule.async_checkpointing=True", "ProbeTask.ballast_kb=1024",
         "ctl.Trainer.use_tf_while_loop=False",
         "ctl.Schedule.steps_per_loop=200", "ctl.Schedule.checkpoint_interval=200")


def test_a_signal_during_an_async_save_names_the_checkpoint_a_restart_restores(gcs, gcs_dir, tmp_path):
    progress = str(tmp_path / "progress")
    gcs.set_latency(300)
    trainer = Trainer(gcs_dir, progress, *ASYNC, "ctl.Schedule.train_steps=1000000")
    try:
        # Step 201 started: the loop of steps 1-200 ended and its checkpoint is being written
        # in the background, a request every 300 ms.
        assert trainer.wait_for_step(201, timeout=240), trainer.finish()[1]
        trainer.proc.send_signal(signal.SIGTERM)
        returncode, stderr = trainer.finish(timeout=240)
    finally:
        trainer.kill()
    gcs.set_latency(0)
    assert returncode == EXIT_PREEMPTED, stderr
    line = ctl_stderr_lines(stderr)[-1]
    assert line.startswith("ctl.run: preempted: stopped by SIGTERM"), stderr
    named = line.split("checkpoint ", 1)[1].split(" ", 1)[0]
    assert tf.train.latest_checkpoint(gcs_dir) == named, line
    saved = int(named.rsplit("-", 1)[1])
    assert read_steps(progress) == list(range(1, saved + 1))  # Every step started is in it.

    run_to_end(gcs_dir, progress, *ASYNC, f"ctl.Schedule.train_steps={saved + 10}")
    assert read_steps(progress) == list(range(1, saved + 11))  # Resumed at saved + 1.
