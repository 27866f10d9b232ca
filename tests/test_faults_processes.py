"""Real trainer processes stopped with SIGTERM, SIGINT and SIGKILL, and a second trainer.

Each test starts `python -m ctl.run` on tests/faults.gin (ProbeTask, seed 7),
watches the progress file the task writes from inside the graph, and signals
the process mid-loop. Every wait is bounded and every process is killed in a
`finally`.
"""

import os
import random
import signal
import subprocess
import sys
import time

import pytest
import tensorflow as tf

from ctl.faults.preemption import EXIT_PREEMPTED
from ctl.core.model_dir import ModelDir
from tests.cli import (ROOT, CtlProcess, checkpoint_values, ctl_stderr_lines, scalars,
                       snapshot)

pytestmark = pytest.mark.slow
FAULTS_GIN = os.path.join(ROOT, "tests", "faults.gin")
MIRRORED = ("--strategy=mirrored", "--cpu_replicas=2")


class Trainer(CtlProcess):
    """One `python -m ctl.run --mode=train` process on `model_dir`, and the steps its
    task started (the progress file)."""

    def __init__(self, model_dir, progress, *bindings, flags=(), mode="train"):
        self.progress = progress
        self.earlier = len(read_steps(progress))  # Lines of earlier processes on the same file.
        super().__init__(f"--mode={mode}", f"--model_dir={model_dir}", f"--gin_file={FAULTS_GIN}",
                         f"--gin_bindings=ProbeTask.progress_file='{progress}'", *flags,
                         *(f"--gin_bindings={b}" for b in bindings))

    def wait_for_step(self, step, timeout=120):
        """Waits until the task has started `step`; False if the process ended first."""
        return self.wait_until(lambda: self.last_started() >= step, timeout)

    def last_started(self):
        """The last step this process started (0: none yet)."""
        steps = read_steps(self.progress)[self.earlier:]
        return steps[-1] if steps else 0


def read_steps(progress):
    if not os.path.exists(progress):
        return []
    with open(progress) as f:
        return [int(line) for line in f.read().split("\n") if line.strip().isdigit()]


def latest_step(model_dir):
    path = tf.train.latest_checkpoint(model_dir)
    return int(path.rsplit("-", 1)[1]) if path else 0


def assert_bit_equal(path_a, path_b):
    a, b = checkpoint_values(path_a), checkpoint_values(path_b)
    assert sorted(a) == sorted(b)
    for name in a:
        if a[name] is not None:  # The input position's state has no array form.
            assert a[name].tobytes() == b[name].tobytes(), name


def run_to_end(model_dir, progress, *bindings, flags=()):
    with Trainer(model_dir, progress, *bindings, flags=flags) as trainer:
        result = trainer.finish()
    assert result.returncode == 0, result.stderr


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


@pytest.mark.parametrize("storage", ["local", "gs"], ids=["default", "default-gs"])
def test_sigkill_at_random_moments_ends_bit_identical(request, tmp_path, storage):
    """Kills the trainer 3 times; the resumed run's weights equal an uninterrupted run's
    (on a local disk, and with both model dirs in a bucket: a real GCS API). Mirrored:
    tests/test_train_step_processes.py, with every train-step setting on."""
    target = 300
    # Host loop: slower steps, so that kills land mid-run on a fast machine.
    bindings = (f"ctl.Schedule.train_steps={target}", "ctl.Trainer.use_tf_while_loop=False")
    root = request.getfixturevalue("gcs_dir") if storage == "gs" else str(tmp_path)
    # Model, optimizer, RNG state and step, bit for bit.
    assert_bit_equal(*straight_and_chaos_runs(tmp_path, target, bindings, (), root=root))


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


def straight_and_chaos_runs(tmp_path, target, bindings, flags, loop=None, root=None):
    """An uninterrupted run and, meanwhile, a `chaos_run` (model dirs under `root`, default
    `tmp_path`; progress files in `tmp_path`); returns their last checkpoints."""
    root = root or str(tmp_path)
    reference = f"{root}/reference"
    with Trainer(reference, str(tmp_path / "reference.progress"), *bindings,
                 flags=flags) as straight:
        chaos_run(tmp_path, target, bindings, flags, loop, root=root)
        result = straight.finish()
    assert result.returncode == 0, result.stderr
    return tf.train.latest_checkpoint(reference), tf.train.latest_checkpoint(f"{root}/chaos")


def chaos_run(tmp_path, target, bindings, flags, loop=None, root=None):
    """Trains to `target`, killed with SIGKILL 3 times at random steps; returns the seed.

    With `loop` (steps_per_loop of a `tf.while_loop` run) the kill steps are drawn
    inside loops, and at least one kill must be seen to land inside one.
    """
    model_dir, progress = f"{root or tmp_path}/chaos", str(tmp_path / "chaos.progress")
    # Seeded, and the seed reported: CTL_CHAOS_SEED=N replays a failing run's kill points.
    seed = int(os.environ.get("CTL_CHAOS_SEED", random.SystemRandom().randrange(2**31)))
    print(f"chaos seed: {seed} (rerun with CTL_CHAOS_SEED={seed})")
    rng = random.Random(seed)
    killed_mid_run = killed_in_loop = 0
    for _ in range(3):
        low, high = latest_step(model_dir) + 1, target - 30
        if low > high:
            break
        # A step past the last checkpoint, so that each kill loses (and replays) work.
        kill_at = rng.randint(low, high)
        if loop:  # In the first half of its loop: room for the overshoot before the loop ends.
            kill_at = kill_at - kill_at % loop + rng.randint(loop // 10, loop // 2)
        with Trainer(model_dir, progress, *bindings, flags=flags) as trainer:
            trainer.wait_for_step(kill_at)
            time.sleep(rng.uniform(0, 0.05))  # Sometimes mid-step, sometimes mid-save.
        started = trainer.last_started()
        print(f"kill at step {kill_at}: exit {trainer.proc.returncode}, last step started {started}, "
              f"latest checkpoint {latest_step(model_dir)}")
        if trainer.proc.returncode == -signal.SIGKILL:
            killed_mid_run += 1
            # The graph had started step `started` and not the next one of the same loop.
            killed_in_loop += bool(loop) and started % loop != 0 and latest_step(model_dir) < started
    assert killed_mid_run >= 1, f"no kill landed mid-run (chaos seed {seed})"
    if loop:
        assert killed_in_loop >= 1, f"no kill landed inside a tf.while_loop (chaos seed {seed})"
    run_to_end(model_dir, progress, *bindings, flags=flags)
    assert latest_step(model_dir) == target, f"chaos seed {seed}"
    return seed


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


def test_a_second_signal_exits_at_once():
    script = (
        "import os, signal, time\n"
        "from ctl.faults.preemption import SignalWatcher\n"
        "with SignalWatcher() as watcher:\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    while watcher.signum is None: time.sleep(0.01)\n"
        "    print('first handled', flush=True)\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(60)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                            timeout=120, env={**os.environ, "PYTHONPATH": ROOT})
    assert "first handled" in result.stdout
    assert result.returncode == 128 + signal.SIGTERM, result.stderr
