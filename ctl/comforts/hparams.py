"""Hyperparameters in TensorBoard: each run's operative gin values as an HParams summary.

When a training run ends normally, the chief writes the operative config
(`ctl.config.gin_config.operative_values`: every parameter gin bound or defaulted,
macros included) with `tensorboard.plugins.hparams.api.hparams` to an events
file in `<model_dir>` itself, the run whose `train/` and `eval/` scalars hold
the metrics. Point TensorBoard at a directory of model dirs and the HParams
dashboard lists every run of a sweep side by side, with its final eval metrics
(`eval/loss`, `eval/accuracy`, ...). The same values are the settings in
`python -m ctl.report --model_dir=A --model_dir=B`'s table.

ctl adds this hook to every run, on the chief.
"""

import os

import tensorflow as tf

from ctl.config import gin_config as config
from ctl.core.hook_protocol import Hook


class HParamsSummary(Hook):
    """Writes the run's operative gin values as an HParams summary at the end of training."""

    def on_trial_close(self, unused_logs) -> None:
        from tensorboard.plugins.hparams import api as hp  # Only when a run ends.

        values = config.operative_values()  # bool, int, float or str: what HParams takes.
        writer = tf.summary.create_file_writer(self.run.directory.path)
        with writer.as_default():
            hp.hparams(values, trial_id=os.path.basename(os.path.normpath(self.run.model_dir)),
                       start_time_secs=None)
        writer.close()

