"""Trainer processes of tests/faults.gin (ProbeTask, seed 7), followed by the progress file the task
writes from inside the graph; and the SIGKILL chaos run beside an uninterrupted one."""

import os
import random
import signal
import time

import tensorflow as tf

from tests.support.env import FAULTS_GIN
from tests.support.processes import Process, ctl_command
from tests.support.reading import latest_step

MIRRORED = ("--strategy=mirrored", "--cpu_replicas=2")
# Kills of a chaos run, each drawn past a checkpoint: the first in a fresh process, the second in
# one that resumed from the first's checkpoint; the last process resumes from the second's. A third
# kill would be one more resumed process killed: a process start (~20 s on a loaded host) more.
KILLS = 2
CHECKPOINT_INTERVAL = 10  # tests/faults.gin's.


def read_steps(progress):
    """The steps the task started, in order, from its progress file."""
    if not os.path.exists(progress):
        return []
    with open(progress) as f:
        return [int(line) for line in f.read().split("\n") if line.strip().isdigit()]


class Trainer(Process):
    """One `python -m ctl.run --mode=train` process on `model_dir`, and the steps its
    task started (the progress file)."""

    def __init__(self, model_dir, progress, *bindings, flags=(), mode="train"):
        self.progress = progress
        self.earlier = len(read_steps(progress))  # Lines of earlier processes on the same file.
        super().__init__(ctl_command(
            f"--mode={mode}", f"--model_dir={model_dir}", f"--gin_file={FAULTS_GIN}",
            f"--gin_bindings=ProbeTask.progress_file='{progress}'", *flags,
            *(f"--gin_bindings={b}" for b in bindings)))

    def wait_for_step(self, step, timeout=120):
        """Waits until the task has started `step`; False if the process ended first."""
        return self.wait_until(lambda: self.last_started() >= step, timeout)

    def last_started(self):
        """The last step this process started (0: none yet)."""
        steps = read_steps(self.progress)[self.earlier:]
        return steps[-1] if steps else 0


def run_to_end(model_dir, progress, *bindings, flags=()):
    with Trainer(model_dir, progress, *bindings, flags=flags) as trainer:
        result = trainer.finish()
    assert result.returncode == 0, result.stderr


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
    """Trains to `target`, killed with SIGKILL `KILLS` times at random steps; returns the seed.

    With `loop` (steps_per_loop of a `tf.while_loop` run) the kill steps are drawn
    inside loops, and at least one kill must be seen to land inside one.
    """
    model_dir, progress = f"{root or tmp_path}/chaos", str(tmp_path / "chaos.progress")
    # Seeded, and the seed reported: CTL_CHAOS_SEED=N replays a failing run's kill points.
    seed = int(os.environ.get("CTL_CHAOS_SEED", random.SystemRandom().randrange(2**31)))
    print(f"chaos seed: {seed} (rerun with CTL_CHAOS_SEED={seed})")
    rng = random.Random(seed)
    killed_mid_run = killed_in_loop = 0
    for _ in range(KILLS):
        low, high = max(latest_step(model_dir), loop or CHECKPOINT_INTERVAL) + 1, target - 30
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
        print(f"kill at step {kill_at}: exit {trainer.returncode}, last step started {started}, "
              f"latest checkpoint {latest_step(model_dir)}")
        if trainer.returncode == -signal.SIGKILL:
            killed_mid_run += 1
            # The graph had started step `started` and not the next one of the same loop.
            killed_in_loop += bool(loop) and started % loop != 0 and latest_step(model_dir) < started
    assert killed_mid_run >= 1, f"no kill landed mid-run (chaos seed {seed})"
    if loop:
        assert killed_in_loop >= 1, f"no kill landed inside a tf.while_loop (chaos seed {seed})"
    run_to_end(model_dir, progress, *bindings, flags=flags)
    assert latest_step(model_dir) == target, f"chaos seed {seed}"
    return seed
