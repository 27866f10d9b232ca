"""`ctl.hooks`: what a hook is, and the hooks ctl ships, for `ctl.Experiment.hooks`.

    ctl.Experiment.hooks = [@ctl.hooks.BestCheckpoint(), @ctl.hooks.EarlyStopping()]
    ctl.hooks.BestCheckpoint.metric = 'accuracy'

The protocol (`Hook`, `HookProtocol`, `Run`) is `ctl.core.hook_protocol`'s, `StopRequest`
`ctl.core.stop`'s; the hooks are `ctl.comforts`' ([Comforts](../comforts.md)). Each hook is a gin configurable under the
same name (`ctl.hooks.NAME`).
"""

from ctl.comforts.best import BestCheckpoint
from ctl.comforts.exporting import BestExporter, CheckpointExporter, FinalExporter, LatestExporter
from ctl.comforts.early_stopping import EarlyStopping
from ctl.comforts.keras_callbacks import KerasCallbacks
from ctl.comforts.profile import Profile
from ctl.comforts.warm_start import WarmStart
from ctl.core.hook_protocol import Hook, HookProtocol, Run, StopRequest

__all__ = ["BestCheckpoint", "BestExporter", "CheckpointExporter", "EarlyStopping",
           "FinalExporter", "Hook", "HookProtocol", "KerasCallbacks", "LatestExporter", "Profile", "Run",
           "StopRequest", "WarmStart"]
