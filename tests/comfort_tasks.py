"""Tasks for the comforts tests: a model with named parts, and one that cannot fit its data."""

import gin

import ctl

from tests.tasks import RegressionTask


@gin.configurable
class EncoderTask(RegressionTask):
    """`encoder` (Dense 4) then `head` (Dense 1, zero-initialized): warm start restores parts."""

    def build_model(self):
        return self.k.Sequential([
            self.k.Input((3,)),
            self.k.layers.Dense(4, name="encoder"),
            self.k.layers.Dense(1, name="head", kernel_initializer="zeros"),
        ])


@gin.configurable
class MisshapenTask(RegressionTask):
    """Its model takes 5 features; the data has 3. A config error smoke mode must catch."""

    def build_model(self):
        return self.k.Sequential([self.k.Input((5,)), self.k.layers.Dense(1)])


@gin.register
class ZeroTargetsTrainer(ctl.Trainer):
    """Trains toward predicting zero: every evaluation on the real targets gets worse."""

    def next_train_inputs(self, iterator):
        features, targets = next(iterator)
        return features, targets * 0.0
