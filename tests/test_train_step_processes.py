"""Kill -9 and resume with every train-step setting on: the run ends bit-identical.

One run with mixed_float16 (loss scaling), XLA, clipping, accumulation and the
moving average together, under MirroredStrategy over two CPUs (tests/faults.gin:
ProbeTask, seed 7): a trainer killed three times at random steps ends with the
same checkpoint, bit for bit, as one that ran straight through, and the state
of each setting is in that checkpoint.
"""

import os

import numpy as np
import pytest

from tests.cli import checkpoint_values, scalars
from tests.test_faults_processes import MIRRORED, assert_bit_equal, straight_and_chaos_runs

pytestmark = pytest.mark.slow

SETTINGS = (
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


def test_sigkill_with_every_train_step_setting_ends_bit_identical(tmp_path):
    target = 100
    bindings = (f"ctl.Schedule.train_steps={target}", *SETTINGS)
    reference, resumed = straight_and_chaos_runs(tmp_path, target, bindings, MIRRORED)
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
    summaries = scalars(os.path.join(str(tmp_path / "chaos"), "train"))
    assert {"loss_scale", "gradient_norm", "learning_rate"} <= set(summaries)
    assert max(summaries["gradient_norm"].values()) > 0.5  # Clipping had work to do.
