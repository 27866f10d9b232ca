"""`ctl.hooks`: what a hook is, and the hooks ctl ships, for `ctl.Experiment.hooks`.

    ctl.Experiment.hooks = [@ctl.hooks.BestCheckpoint(), @ctl.hooks.EarlyStopping()]
    ctl.hooks.BestCheckpoint.metric = 'accuracy'

The protocol (`Hook`, `HookProtocol`, `Run`) is `ctl.core.hook_protocol`'s, `StopRequest`
`ctl.core.stop`'s; the hooks are this package's modules ([Comforts](../comforts.md)). Each hook is a gin configurable
under the same name (`ctl.hooks.NAME`).

The modules: the best checkpoint (`best`), SavedModel exporters (`exporting`), early stopping (`early_stopping`,
reading results as `eval_results` does), Keras callbacks (`keras_callbacks`), warm starting a subset of variables
(`warm_start`), a profile of chosen steps (`profile`), and the two hooks ctl adds to every run on the chief: the gin
values as HParams (`hparams`) and metrics.jsonl (`progress`).
"""

from ctl.hooks.best import BestCheckpoint
from ctl.hooks.exporting import BestExporter, CheckpointExporter, FinalExporter, LatestExporter
from ctl.hooks.early_stopping import EarlyStopping
from ctl.hooks.keras_callbacks import KerasCallbacks
from ctl.hooks.profile import Profile
from ctl.hooks.warm_start import WarmStart
from ctl.core.hook_protocol import Hook, HookProtocol, Run, StopRequest

__all__ = ["BestCheckpoint", "BestExporter", "CheckpointExporter", "EarlyStopping",
           "FinalExporter", "Hook", "HookProtocol", "KerasCallbacks", "LatestExporter", "Profile", "Run",
           "StopRequest", "WarmStart"]
