"""SavedModel exporters: latest, best by an eval metric, and final; N kept each.

As `tf.estimator`'s LatestExporter, BestExporter and FinalExporter (and
Determined's export of every checkpoint: CheckpointExporter), each an ordinary
hook (`ctl.hooks`) acting on evaluation results or checkpoint saves:

    ctl.Experiment.hooks = [@ctl.hooks.LatestExporter(), @ctl.hooks.BestExporter(), @ctl.hooks.FinalExporter()]
    ctl.hooks.BestExporter.metric = 'accuracy'
    ctl.hooks.BestExporter.higher_is_better = True

Exports go to `<model_dir>/export/<name>/<global step>/`. Each is written to a
temporary directory next to it and published whole (`ctl.model_dir.
publishing`: renamed into place on a file system; in an object store
copied with `saved_model.pb` and then the marker `ctl_published.json` last), so
a reader sees a whole SavedModel or none, and a restart replaces a half one
that an interrupted export left. A step already exported is not written again.
The signatures are the task's `serving_signatures(model)`.

All of this runs eagerly on the host, on the chief (or on a sidecar evaluator,
which binds its own model and step; see docs/comforts.md).
"""

from typing import Callable, Dict, List, Optional

import gin
import tensorflow as tf

from ctl.comforts.best import BestMetric
from ctl.utils import console
from ctl.utils.errors import UserError
from ctl.core.hook_protocol import Hook, Run
from ctl.model_dir import is_published, publishing, temporaries
from ctl.core.serving import default_serving_signatures


def export_saved_model(model, signatures: Dict[str, Callable], export_dir: str) -> Optional[str]:
    """Writes `model` with `signatures` to `export_dir`, published whole; None if it was."""
    if is_published(export_dir):
        return None
    module = tf.Module()
    module.model = model  # Tracks the variables the signatures read.
    with publishing(export_dir, last=["saved_model.pb"]) as temp:
        tf.saved_model.save(module, temp, signatures=signatures)
    return export_dir


class Exporter(Hook):
    """Exports the bound model to `<model_dir>/export/<name>/<step>`, keeping `max_to_keep`."""

    def __init__(self, name: str, max_to_keep: int = 5):
        if isinstance(max_to_keep, bool) or not isinstance(max_to_keep, int) or max_to_keep < 1:
            raise UserError(f"{type(self).__name__}.max_to_keep ({max_to_keep!r}) must be a "
                            "positive integer.")
        self.name = name
        self.max_to_keep = max_to_keep

    @property
    def directory(self) -> str:
        return self.run.directory.export_dir(self.name)

    def exported_steps(self, published: bool = True) -> List[int]:
        """The steps exported (whole ones; all with `published=False`), oldest first."""
        if not tf.io.gfile.isdir(self.directory):
            return []
        steps = sorted(int(name.rstrip("/")) for name in tf.io.gfile.listdir(self.directory)
                       if name.rstrip("/").isdigit())
        return [s for s in steps if not published
                or is_published(self.run.directory.export_step_dir(self.name, s))]

    def export(self) -> Optional[str]:
        if not self.run.chief:
            return None
        path = self.run.directory.export_step_dir(self.name, self.run.step)
        model = self.run.eval_model  # The moving average, with ctl.Trainer.ema_decay.
        if getattr(self, "_signatures", None) is None:  # Traced once, reused by every export.
            self._signatures = serving_signatures(self.run.task, model)
        written = export_saved_model(model, self._signatures, path)
        if written:
            console.info("export", "%s SavedModel: %s", self.name, written, step=self.run.step)
        kept = self.exported_steps()[-self.max_to_keep:]
        for step in self.exported_steps(published=False):
            if step not in kept:  # Retired, or half of an export a kill interrupted.
                tf.io.gfile.rmtree(self.run.directory.export_step_dir(self.name, step))
        for temp in temporaries(self.directory):  # What a killed export left aside.
            tf.io.gfile.rmtree(temp)
        return written


def serving_signatures(task, model) -> Dict[str, Callable]:
    if task is not None and hasattr(task, "serving_signatures"):
        return task.serving_signatures(model)
    return default_serving_signatures(model)


@gin.configurable(module="ctl.hooks")
class LatestExporter(Exporter):
    """Exports after every evaluation."""

    def __init__(self, max_to_keep: int = 5, name: str = "latest"):
        super().__init__(name, max_to_keep)

    def on_eval_end(self, unused_logs) -> None:
        self.export()


@gin.configurable(module="ctl.hooks")
class BestExporter(Exporter):
    """Exports when an evaluation beats the best `metric` so far (kept across restarts)."""

    def __init__(self, metric: str = "loss", higher_is_better: bool = False,
                 max_to_keep: int = 1, name: str = "best"):
        super().__init__(name, max_to_keep)
        self.metric = metric
        self.higher_is_better = higher_is_better

    def bind(self, run: Run) -> None:
        super().bind(run)
        self.best = BestMetric(self.metric, self.higher_is_better,
                               self.run.directory.export_best_record_file(self.name),
                               write=run.chief, owner="ctl.hooks.BestExporter")

    def on_eval_end(self, logs) -> None:
        if self.best.test(logs):
            path = self.export()
            self.best.commit(logs, step=self.run.step, path=path)


@gin.configurable(module="ctl.hooks")
class CheckpointExporter(Exporter):
    """Exports each checkpoint as it is saved (Determined's per-checkpoint SavedModels)."""

    def __init__(self, max_to_keep: int = 5, name: str = "checkpoint"):
        super().__init__(name, max_to_keep)

    def on_checkpoint_end(self, unused_path) -> None:
        self.export()


@gin.configurable(module="ctl.hooks")
class FinalExporter(Exporter):
    """Exports once, when the run ends."""

    def __init__(self, max_to_keep: int = 1, name: str = "final"):
        super().__init__(name, max_to_keep)

    def on_trial_close(self, unused_logs) -> None:
        self.export()
