"""Real trainer processes stopped with SIGTERM, SIGINT and SIGKILL (also with every train-step
setting on), and a second trainer.

Each test starts `python -m ctl.run` on tests/faults.gin (ProbeTask, seed 7),
watches the progress file the task writes from inside the graph, and signals
the process mid-loop. Every wait is bounded and every process is killed on the way out
(tests/support/probe.py).
"""

import os
import signal

import numpy as np
import pytest

from ctl.core.stop import EXIT_PREEMPTED
from tests.support.probe import MIRRORED, Trainer, read_steps, run_to_end, straight_and_chaos_runs
from tests.support.processes import python_command, run
from tests.support.reading import (assert_bit_equal, checkpoint_values, ctl_stderr_lines, latest_step, scalars,
                                   snapshot)
from ctl.model_dir import ModelDir

pytestmark = pytest.mark.slow


def signal_while_held(trainer, held, signum, release):
    """Sends `signum` once `held()` (a step waits for the file `release`), waits until the
    process says it received it, then lets the step end; returns the CompletedProcess."""
    with trainer:
        assert trainer.wait_until(held), trainer.finish().stderr
        trainer.proc.send_signal(signum)
        trainer.wait_for_output(f"received {signal.Signals(signum).name}")
        release.touch()
        return trainer.finish(timeout=120)


@pytest.mark.parametrize("signum, while_loop, flags", [
    (signal.SIGTERM, True, ()), (signal.SIGINT, False, ()), (signal.SIGTERM, True, MIRRORED),
], ids=["SIGTERM-tf_while_loop", "SIGINT-host_loop", "SIGTERM-tf_while_loop-mirrored"])
def test_signal_saves_at_the_next_step_and_resume_loses_no_step(tmp_path, signum, while_loop, flags):
    model_dir, progress = str(tmp_path / "run"), str(tmp_path / "progress")
    release = tmp_path / "release"
    # One loop of 100,000 steps: the signal must not wait for it to end.
    long_run = ("ctl.Schedule.train_steps=1000000", "ctl.Schedule.steps_per_loop=100000",
                "ctl.Schedule.checkpoint_interval=100000",
                f"ctl.Trainer.use_tf_while_loop={while_loop}")
    # Step 300 waits for `release`: the signal arrives while it runs, and is taken
    # (the process says so) before it ends.
    hold = ("ProbeTask.hold_at_step=300", f"ProbeTask.hold_file='{release}'")
    trainer = Trainer(model_dir, progress, *long_run, *hold, flags=flags)
    result = signal_while_held(trainer, lambda: trainer.last_started() >= 300, signum, release)
    assert result.returncode == EXIT_PREEMPTED, result.stderr
    lines = ctl_stderr_lines(result.stderr)
    assert lines[-1].startswith("ctl.run: preempted: stopped by " + signal.Signals(signum).name), \
        result.stderr
    saved = latest_step(model_dir)
    started = read_steps(progress)
    # Every step that started was completed and is in the checkpoint; none started after
    # the one the signal arrived in.
    assert started == list(range(1, saved + 1))
    assert saved == 300
    assert f"ckpt-{saved}" in lines[-1]

    run_to_end(model_dir, progress, *long_run[1:], f"ctl.Schedule.train_steps={saved + 10}",
               flags=flags)
    assert latest_step(model_dir) == saved + 10
    assert read_steps(progress) == list(range(1, saved + 11))  # Resumed at saved + 1.


@pytest.mark.parametrize("eval_steps", [None, 500], ids=["whole_set-host_loop", "fixed-tf_while_loop"])
def test_a_signal_stops_an_in_line_evaluation_at_its_next_step(tmp_path, eval_steps):
    """SIGTERM during a 1,000-step evaluation of step 10: no eval step after the one it
    arrived in, exit 75 with the checkpoint of step 10, and the incomplete results written
    nowhere."""
    model_dir, progress = str(tmp_path / "run"), str(tmp_path / "progress")
    eval_progress, release = str(tmp_path / "eval_progress"), tmp_path / "release"
    bindings = ["ctl.Schedule.train_steps=20", "ctl.Schedule.eval_interval=10",
                "ProbeTask.eval_examples=8000", f"ProbeTask.eval_progress_file='{eval_progress}'",
                "ProbeTask.hold_at_eval_step=5", f"ProbeTask.hold_file='{release}'"]
    if eval_steps:
        bindings.append(f"ctl.Schedule.eval_steps={eval_steps}")
    trainer = Trainer(model_dir, progress, *bindings, mode="train_and_eval")

    def eval_step_5_waits():
        return read_steps(eval_progress)[-1:] == [5]
    result = signal_while_held(trainer, eval_step_5_waits, signal.SIGTERM, release)
    assert result.returncode == EXIT_PREEMPTED, result.stderr
    lines = ctl_stderr_lines(result.stderr)
    assert lines[-1].startswith("ctl.run: preempted: stopped by SIGTERM at step 10;"), result.stderr
    assert "ckpt-10" in lines[-1] and latest_step(model_dir) == 10
    assert read_steps(eval_progress) == [1, 2, 3, 4, 5]
    eval_dir = os.path.join(model_dir, "eval")
    assert not os.path.isdir(eval_dir) or "loss" not in scalars(eval_dir)
    assert not [r for r in ModelDir(model_dir).metrics("eval")]


def test_sigkill_inside_tf_while_loops_ends_bit_identical(tmp_path):
    """Kills land while a `tf.while_loop` runs its steps (evidence: the last step the
    graph started is not a loop's last); the resumed run equals an uninterrupted one."""
    # Long loops of fast steps (~0.1 ms): a kill overshoots its step by hundreds of steps.
    target, loop = 20000, 5000
    bindings = (f"ctl.Schedule.train_steps={target}", f"ctl.Schedule.steps_per_loop={loop}",
                f"ctl.Schedule.checkpoint_interval={loop}", "ctl.Trainer.use_tf_while_loop=True",
                "ProbeTask.train_examples=124")  # Epochs of 15.5 batches: no loop ends an epoch.
    reference, chaos = straight_and_chaos_runs(tmp_path, target, bindings, (), loop=loop)
    assert_bit_equal(reference, chaos)


# Every train-step setting of docs/train_step.md on at once.
TRAIN_STEP_SETTINGS = (
    "ctl.Trainer.mixed_precision='mixed_float16'", "ctl.Trainer.jit_compile=True",
    "ctl.Trainer.clip_norm=0.5", "ctl.Trainer.accumulation_steps=2",
    "ctl.Trainer.ema_decay=0.9",
    # The progress file is written by the trainer: XLA cannot compile tf.print in the step.
    "ctl.Experiment.trainer_cls=@ProgressTrainer", "ProbeTask.progress_in_step=False",
    # No NaN glitches: their bookkeeping variable lives outside the strategy's scope.
    "ProbeTask.transient=False",
    # Host loop: slower steps, so that kills land mid-run.
    "ctl.Trainer.use_tf_while_loop=False",
)


def test_sigkill_with_every_train_step_setting_ends_bit_identical(tmp_path, gcs_dir):
    """Mixed_float16 (loss scaling), XLA, clipping, accumulation and the moving average together,
    under MirroredStrategy over two CPUs, the host loop, both model dirs in a bucket (a real GCS
    API: checkpoints staged, then uploaded off the training thread): a trainer killed twice at
    random steps ends with the same checkpoint, bit for bit, as one that ran straight through,
    and the state of each setting is in that checkpoint. The default strategy on a local disk:
    the kills inside `tf.while_loop`s above."""
    target = 100
    bindings = (f"ctl.Schedule.train_steps={target}", *TRAIN_STEP_SETTINGS)
    # Model, optimizer, RNG state and step, bit for bit.
    reference, resumed = straight_and_chaos_runs(tmp_path, target, bindings, MIRRORED, root=gcs_dir)
    assert_bit_equal(reference, resumed)
    # Each setting's state is in the checkpoint, and it was at work.
    values = {name: value for name, value in checkpoint_values(resumed).items()
              if value is not None}
    scale = [v for name, v in values.items() if name.startswith("optimizer/")
             and "dynamic_scale" in name]
    assert len(scale) == 1 and float(scale[0]) < 2.0**15  # Overflows lowered the loss scale.
    assert int(values["ema/updates/.ATTRIBUTES/VARIABLE_VALUE"]) == target
    averages = [v for name, v in values.items() if name.startswith("ema/model/")]
    assert averages and all(np.all(np.isfinite(v)) for v in averages)
    summaries = scalars(f"{gcs_dir}/chaos/train")
    assert {"loss_scale", "gradient_norm", "learning_rate"} <= set(summaries)
    assert max(summaries["gradient_norm"].values()) > 0.5  # Clipping had work to do.


def test_second_trainer_is_refused_and_a_killed_one_does_not_block(tmp_path):
    model_dir, progress = str(tmp_path / "run"), str(tmp_path / "progress")
    # Host loop: minutes before its first loop (and first checkpoint) ends.
    with Trainer(model_dir, progress, "ctl.Schedule.train_steps=1000000",
                 "ctl.Schedule.steps_per_loop=100000", "ctl.Trainer.use_tf_while_loop=False") as first:
        assert first.wait_for_step(10), first.finish().stderr
        before = snapshot(model_dir)["config.gin"]
        with Trainer(model_dir, str(tmp_path / "progress2"), "ctl.Schedule.train_steps=5") as second:
            result = second.finish()
        assert result.returncode == 2, result.stderr
        lines = ctl_stderr_lines(result.stderr)
        assert len(lines) == 1, result.stderr
        assert "is in use by another trainer" in lines[0] and f"pid {first.proc.pid}" in lines[0]
        assert snapshot(model_dir)["config.gin"] == before  # Its config (train_steps=5) not saved.
        assert not os.path.exists(tmp_path / "progress2")  # It never trained.
    # Killed on the way out (SIGKILL): the lock file stays, the lock does not.
    assert os.path.exists(os.path.join(model_dir, "trainer.lock"))
    run_to_end(model_dir, progress, "ctl.Schedule.train_steps=20")
    assert latest_step(model_dir) == 20


@pytest.mark.parametrize("train", [True, False], ids=["trainer", "sidecar"])
def test_a_second_signal_exits_at_once(train):
    """The trainer's watcher and the sidecar's (`ctl.core.stop.SignalWatcher(train=False)`)."""
    script = (
        "import os, signal, time\n"
        "from ctl.core.stop import SignalWatcher\n"
        f"with SignalWatcher(train={train}) as watcher:\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    while watcher.signum is None: time.sleep(0.01)\n"
        "    print('first handled', flush=True)\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(60)\n"
    )
    result = run(python_command(script), timeout=120)
    assert "first handled" in result.stdout
    assert result.returncode == 128 + signal.SIGTERM, result.stderr
