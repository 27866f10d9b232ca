"""What the sweep tests share: the digits config, tiny trial settings, and a file writer."""

import os

from tests.support.env import ROOT

DIGITS_GIN = os.path.join(ROOT, "configs", "digits.gin")
HOLD_GIN = os.path.join(ROOT, "tests", "hold.gin")  # Holds a run at its checkpoints (tests/hold_tasks.py).
# Long enough after the first evaluation (step 20) for a prune to land before the run ends.
TINY = ["--gin_bindings=TRAIN_STEPS=400", "--gin_bindings=ctl.Schedule.eval_interval=20",
        "--gin_bindings=ctl.Schedule.steps_per_loop=10",
        "--gin_bindings=ctl.Schedule.checkpoint_interval=20"]


def write(path, text) -> str:
    """Writes `text` to `path`; returns the path as a string."""
    with open(path, "w") as f:
        f.write(text)
    return str(path)
