"""What a Model Garden model dir holds besides ctl's files, written by ctl for its tools.

`ModelGardenFiles` (a hook `ctl.ModelGardenTask.config_hooks()` gives) writes, on the chief:

- `params.yaml`: the experiment's config, as Model Garden's train.py writes it in a mode that
  trains (`official.core.train_utils.serialize_config`), after the first train loop;
- each evaluation's scalars as summaries in `<model_dir>/<trainer.validation_summary_subdir>`
  (Model Garden's `validation/`), beside ctl's `eval/`, under Model Garden's names
  (`ctl.core.evaluation.model_garden_names`: the eval loss's mean is `validation_loss`).

The best checkpoint's `best_ckpt/` and `info.json` are `ctl.hooks.BestCheckpoint`'s
(`export_subdir`).

`PretrainRecords` writes what Model Garden's continuous fine-tuning
(`official.nlp.continuous_finetune_lib`, `--mode=continuous_train_and_eval`) writes in its model
dir after each fine-tune: `metrics-<pretraining step>.json` (`train_utils.write_json_summary`),
the results as summaries in `eval/` at the pretraining step, and `params.yaml`.
"""

import json
import os
import tempfile
from typing import Any, Callable, Dict, Optional

import tensorflow as tf

from ctl.core.evaluation import model_garden_names
from ctl.core.hook_protocol import Hook
from ctl.model_dir import write_atomically

PARAMS_FILE = "params.yaml"
# Continuous fine-tuning's JSON summary (Model Garden's `continuous_finetune_lib`), in the job's model dir.
PRETRAIN_METRICS_FILE = "metrics-{step}.json"
CTL_EVAL_SUBDIR = "eval"  # ctl's own (`ModelDir.eval_dir`): nothing to add there.


def params_yaml(params) -> str:
    """The text Model Garden's `serialize_config` writes for `params`.

    Args:
        params: an `ExperimentConfig`.
    """
    from official.modeling import hyperparams

    with tempfile.TemporaryDirectory(prefix="ctl-params-") as directory:
        path = os.path.join(directory, PARAMS_FILE)
        hyperparams.save_params_dict_to_yaml(params, path)
        with open(path) as f:
            return f.read()


class ModelGardenFiles(Hook):
    """Writes `params.yaml` after the first train loop and each evaluation's summaries in Model
    Garden's validation subdir (on the chief).

    Args:
        params: the experiment's `ExperimentConfig`.
    """

    def __init__(self, params):
        self.params = params
        self.subdir: str = params.trainer.validation_summary_subdir
        self._params_written = False
        self._writer: Optional[Any] = None

    def on_train_loop_end(self, logs: Dict[str, Any]) -> None:
        """Writes `params.yaml` once, after the first train loop.

        Args:
            logs: the loop's results (unused).
        """
        if self._params_written or not self.run.chief:
            return
        write_atomically(self.run.directory.file(PARAMS_FILE), params_yaml(self.params))
        self._params_written = True

    def on_eval_end(self, logs: Dict[str, Any]) -> None:
        """Writes the evaluation's scalars at its step in `<model_dir>/<validation_summary_subdir>`.

        Args:
            logs: the evaluation's results (named eval sets nested, `{set: {metric: value}}`).
        """
        if not self.run.chief or not self.subdir or self.subdir.strip("/") == CTL_EVAL_SUBDIR:
            return
        if self._writer is None:
            self._writer = tf.summary.create_file_writer(self.run.directory.file(self.subdir))
        with self._writer.as_default():
            for name, value in _flat(model_garden_names(logs)).items():
                tf.summary.scalar(name, value, step=self.run.step)
        self._writer.flush()


class PretrainRecords:
    """After each fine-tune of continuous fine-tuning, Model Garden's records in the model dir:
    `metrics-<step>.json` (each result as a string, as `train_utils.write_json_summary` writes
    them), the results as scalars in `eval/` at the pretraining step, named
    `<model dir's name>_<task's name>/<result>` (nested results joined by "-"), and once,
    `params.yaml` (the experiment's config: `task.init_checkpoint` the watched directory), under
    Model Garden's names (the eval loss's mean is `validation_loss`).

    Args:
        params: the experiment's `ExperimentConfig`.
        directory: the job's model dir.
        task_name: gives the Model Garden task's name (its `name`), asked once, at the first
            fine-tune's end.
    """

    def __init__(self, params, directory, task_name: Callable[[], str]):
        self.params = params
        self.directory = directory
        self.task_name = task_name
        self._group: Optional[str] = None
        self._writer: Optional[Any] = None

    def __call__(self, pretrained, results: Dict[str, Any]) -> None:
        """Writes the records of one fine-tune.

        Args:
            pretrained: the pretraining checkpoint it started from
                (`ctl.sidecar.continuous_finetune.Pretrained`: its `step`).
            results: its final evaluation's results.
        """
        if self._group is None:
            write_atomically(self.directory.file(PARAMS_FILE), params_yaml(self.params))
            self._group = f"{os.path.basename(self.directory.path.rstrip('/'))}_{self.task_name()}"
            # Model Garden's `eval/`, which is ctl's eval dir.
            self._writer = tf.summary.create_file_writer(self.directory.eval_dir)
        results = _flat(model_garden_names(results), separator="-")
        text = json.dumps({name: str(value) for name, value in results.items()}, indent=4)
        write_atomically(self.directory.file(PRETRAIN_METRICS_FILE.format(step=pretrained.step)),
                         text + "\n")
        with self._writer.as_default():
            for name, value in results.items():
                tf.summary.scalar(f"{self._group}/{name}", value, step=pretrained.step)
        self._writer.flush()


def _flat(logs, prefix: str = "", separator: str = "/") -> Dict[str, float]:
    """The scalars of `logs`, nested dicts as `a/b` (as orbit's summary manager names them; or
    joined by `separator`)."""
    flat: Dict[str, float] = {}
    for name, value in logs.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{name}{separator}", separator))
            continue
        try:
            tensor = tf.convert_to_tensor(value)
        except (TypeError, ValueError):
            continue
        if tensor.shape.rank == 0 and (tensor.dtype.is_floating or tensor.dtype.is_integer):
            flat[f"{prefix}{name}"] = float(tensor.numpy())
    return flat
