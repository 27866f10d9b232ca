"""The best checkpoint by an eval metric: tracked, persisted, never retired.

    ctl.Experiment.hooks = [@ctl.hooks.BestCheckpoint()]
    ctl.hooks.BestCheckpoint.metric = 'accuracy'
    ctl.hooks.BestCheckpoint.higher_is_better = True

After an evaluation that beats the best value so far, `BestCheckpoint` writes
the evaluated state (`run.checkpoint`: model, optimizer, global step) to
`<model_dir>/best/ckpt-<step>` and records it in `<model_dir>/best/best.json`:

    {"metric": "accuracy", "higher_is_better": true, "value": 0.97, "step": 1500,
     "path": ".../best/ckpt-1500"}

Both writes are whole, in that order: the checkpoint is written aside and
published (`ctl.model_dir.publishing`: a rename on a file system; in
an object store its `.index` copied last, then a marker), then the record,
atomically; so a crash leaves the previous record valid. The best checkpoint lives outside the
files `tf.train.CheckpointManager` manages, so `max_checkpoints` retention
never deletes it; a restart reads `best.json` and only replaces the best with
a better one. Restore it with `tf.train.Checkpoint(...).read(record["path"])`.

With `export_subdir` (a Model Garden experiment's `trainer.best_checkpoint_export_subdir`,
`best_ckpt`), each new best is also written where Model Garden's `BestCheckpointExporter`
writes it, for its tools: `<model_dir>/<export_subdir>/best_ckpt-<step>` (one kept, with its
`checkpoint` state file) and `info.json`, the evaluation's scalars with
`best_ckpt_global_step`, under Model Garden's names (`ctl.core.evaluation.model_garden_names`:
the eval loss's mean is `validation_loss`).

Runs eagerly on the host, on the chief (or a sidecar evaluator).
"""

import json
import os
from typing import Any, Dict, List, Optional

import numpy as np

import gin
import tensorflow as tf

from ctl.hooks.eval_results import improved, metric_value
from ctl.utils import console
from ctl.core.evaluation import model_garden_names
from ctl.core.hook_protocol import Hook, Run
from ctl.model_dir import (ModelDir, entries, is_temporary, publishing, read_json, write_atomically,
                           write_json)

BEST_DIR = "best"  # In the model dir: the best checkpoint (`ckpt-<step>/`) and its record.
BEST_RECORD_FILE = "best.json"  # In BEST_DIR, and in each `BestExporter`'s `export/<name>/`.
# Model Garden's layout (official.core.train_utils.BestCheckpointExporter).
GARDEN_CHECKPOINT_NAME = "best_ckpt"
GARDEN_RECORD_FILE = "info.json"


def best_record(directory: ModelDir) -> Dict[str, Any]:
    """`BestCheckpoint`'s record in a model dir.

    Args:
        directory: the run's model dir.

    Returns:
        The record (`{"metric", "higher_is_better", "value", "step", "path"}`), empty if none.
    """
    return read_json(directory.file(BEST_DIR, BEST_RECORD_FILE), {})


class BestMetric:
    """The best value of `metric` so far, persisted atomically in a JSON file.

    Like `orbit.actions.NewBestMetric`, but the record also holds the step and
    the path of what was saved, and the file is written only when there is a
    best to record (never at start, so a run that fails early leaves no trace).

    Args:
        metric: the evaluation result compared, by name (`"set/name"` for a named eval set, e.g. `"val/accuracy"`).
        higher_is_better: True when a larger value is better (accuracy), False when smaller is (loss).
        filename: the JSON record's path (read now; written at each new best).
        write: whether this process writes the record (the chief); others only read it.
        owner: the hook named in messages (e.g. `ctl.hooks.BestExporter`).
    """

    def __init__(self, metric: str, higher_is_better: bool, filename: str,
                 write: bool = True, owner: str = "ctl.hooks.BestCheckpoint"):
        self.metric = metric
        self.higher_is_better = higher_is_better
        self.owner = owner
        self.filename = filename
        self.write = write
        record = read_json(filename, {})
        self._record = record if isinstance(record, dict) else {}
        record = self._record
        if record and (record.get("metric"), record.get("higher_is_better")) != (
                metric, higher_is_better):
            console.warning("best", "%s: %s tracks %s (higher_is_better=%s), not %s (%s); starting over.",
                            owner, filename, record.get("metric"),
                            record.get("higher_is_better"), metric, higher_is_better)
            self._record = {}

    @property
    def record(self) -> Dict[str, Any]:
        return dict(self._record)

    @property
    def value(self) -> Optional[float]:
        return self.record.get("value")

    def test(self, logs) -> bool:
        """Whether `logs` beat the best value so far (records nothing).

        Args:
            logs: the evaluation's results by metric name (named eval sets nested, `{set: {metric: value}}`).

        Returns:
            True when `metric` in `logs` improves on the best so far (or there is none).

        Raises:
            UserError: `logs` hold no `metric` (the message lists the metrics there are).
        """
        return improved(metric_value(logs, self.metric, self.owner), self.value,
                        self.higher_is_better)

    def commit(self, logs, step: int, path: Optional[str] = None) -> None:
        """Records `logs`' value of `metric` as the new best (written atomically when `write`).

        Args:
            logs: the evaluation's results by metric name (named eval sets nested, `{set: {metric: value}}`).
            step: the global step of the evaluation.
            path: what was saved for it (a checkpoint or an export), or None.
        """
        self._record = {"metric": self.metric, "higher_is_better": self.higher_is_better,
                        "value": metric_value(logs, self.metric, self.owner),
                        "step": step, "path": path}
        if self.write:
            write_json(self.filename, self._record)


@gin.configurable(module="ctl.hooks")
class BestCheckpoint(Hook):
    """Keeps the checkpoint of the best evaluation by `metric` in `<model_dir>/best`.

    Args:
        metric: the evaluation result compared, by name (`"set/name"` for a named eval set, e.g. `"val/accuracy"`).
        higher_is_better: True when a larger value is better (accuracy), False when smaller is (loss).
        export_subdir: also write each best where Model Garden writes it: `<model_dir>/<export_subdir>/`
            (`best_ckpt-<step>`, `info.json`); None: ctl's `best/` only.
    """

    def __init__(self, metric: str = "loss", higher_is_better: bool = False,
                 export_subdir: Optional[str] = None):
        self.metric = metric
        self.higher_is_better = higher_is_better
        self.export_subdir = export_subdir or None

    def __eq__(self, other) -> bool:
        """Two keep the same checkpoint (`ctl.run`'s extra hooks skip one the experiment has)."""
        return (type(other) is type(self) and other.metric == self.metric
                and other.higher_is_better == self.higher_is_better
                and other.export_subdir == self.export_subdir)

    def __hash__(self) -> int:
        return hash((type(self), self.metric, self.higher_is_better, self.export_subdir))

    def bind(self, run: Run) -> None:
        """Reads the best value so far from `<model_dir>/best/best.json` (or starts without one).

        Args:
            run: the run's `ctl.hooks.Run` (model dir, model, step, stop request), kept as `self.run`.
        """
        super().bind(run)
        self.directory = run.directory.file(BEST_DIR)
        self.best = BestMetric(self.metric, self.higher_is_better,
                               run.directory.file(BEST_DIR, BEST_RECORD_FILE), write=run.chief)

    def on_eval_end(self, logs) -> None:
        """On the chief, writes the evaluated state to `<model_dir>/best` if `logs` beat the best so far.

        Args:
            logs: the evaluation's results by metric name (named eval sets nested, `{set: {metric: value}}`).
        """
        if not self.best.test(logs) or not self.run.chief:
            return
        step = self.run.step
        path = self._write(step)
        if self.export_subdir:
            self._write_model_garden(logs, step)
        self.best.commit(logs, step=step, path=path)
        self._remove_all_but(step)
        console.info("best", "%s = %.6g, best so far: %s", self.metric, self.best.value, path,
                     step=step)

    def _write_model_garden(self, logs, step: int) -> None:
        """The best checkpoint and its `info.json` as Model Garden's BestCheckpointExporter writes them."""
        directory = self.run.directory.file(self.export_subdir)
        tf.train.CheckpointManager(self.run.checkpoint, directory, max_to_keep=1,
                                   checkpoint_name=GARDEN_CHECKPOINT_NAME).save(checkpoint_number=step)
        record = _scalars(model_garden_names(logs))
        record["best_ckpt_global_step"] = step
        write_atomically(os.path.join(directory, GARDEN_RECORD_FILE),
                         json.dumps(record, indent=4) + "\n")

    def _checkpoint(self, step: int) -> str:
        """`best/ckpt-<step>/ckpt`: the best checkpoint, in a directory published whole."""
        return self.run.directory.file(BEST_DIR, f"ckpt-{step}", "ckpt")

    def _write(self, step: int) -> str:
        """Writes the best checkpoint of `step`, published whole (`publishing`, its `.index`
        last) at `best/ckpt-<step>/`."""
        final = self._checkpoint(step)
        with publishing(os.path.dirname(final), last=["*.index"]) as temp:
            self.run.checkpoint.write(os.path.join(temp, os.path.basename(final)))
        return final

    def _leftovers(self, step: int) -> List[str]:
        """What `best/` holds besides the best checkpoint of `step`: earlier best checkpoints
        (`ckpt-N/`) and temporaries a kill left, in listing order."""
        keep = os.path.basename(os.path.dirname(self._checkpoint(step)))
        return [path for name, path in entries(self.directory)
                if (name.startswith("ckpt-") or is_temporary(name)) and name != keep]

    def _remove_all_but(self, step: int) -> None:
        for path in self._leftovers(step):
            tf.io.gfile.rmtree(path)



def _scalars(logs) -> Dict[str, Any]:
    """`logs` with its scalars as floats, nested dicts kept, other values (images) dropped."""
    kept: Dict[str, Any] = {}
    for name, value in logs.items():
        if isinstance(value, dict):
            kept[name] = _scalars(value)
            continue
        array = np.asarray(value)
        if array.ndim == 0 and np.issubdtype(array.dtype, np.number):
            kept[name] = float(array)
    return kept
