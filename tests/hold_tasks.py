"""A hook that holds a run after a checkpoint while a file the test controls exists.

Tests that signal or kill runs mid-training wait for "held", not for a checkpoint on disk: a
checkpoint past step 0 also exists once a run has finished, and a fast host finishes a short run
before a slow test looks (a sweep's trial of 1,000 steps in 7 s). Held, the run cannot end until
the test removes the gate, however fast or slow the host.
"""

import os
import time

import gin

import ctl

HOLD_LIMIT_S = 900  # Bounded: a gate left behind (a test that died) ends the run with an error.


def held_marker(gate: str, model_dir: str) -> str:
    """The file `HoldAtCheckpoints` writes (the step it holds at) for the run in `model_dir`."""
    return f"{gate}.{os.path.basename(os.path.normpath(model_dir))}"


def held_step(gate: str, model_dir: str):
    """The step the run in `model_dir` is held at (None: not held, or not yet)."""
    try:
        with open(held_marker(gate, model_dir)) as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


@gin.configurable
class HoldAtCheckpoints(ctl.hooks.Hook):
    """After each checkpoint past step 0, while the file `gate` exists: writes the step to
    `held_marker(gate, model_dir)` and waits until the gate is removed."""

    def __init__(self, gate):
        self.gate = gate

    def on_checkpoint_end(self, unused_path):
        step = self.run.step
        if step == 0 or not os.path.exists(self.gate):
            return
        marker = held_marker(self.gate, self.run.model_dir)
        with open(marker + ".tmp", "w") as f:
            f.write(str(step))
        os.replace(marker + ".tmp", marker)
        deadline = time.monotonic() + HOLD_LIMIT_S
        while os.path.exists(self.gate):
            if time.monotonic() > deadline:
                raise RuntimeError(f"held at step {step} for {HOLD_LIMIT_S} s: {self.gate} is still there")
            time.sleep(0.05)
