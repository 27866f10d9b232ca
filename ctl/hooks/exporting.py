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

from typing import Any, Callable, Dict, List, Optional, Tuple

import gin
import numpy as np
import tensorflow as tf

from ctl.hooks.best import BEST_RECORD_FILE, BestMetric
from ctl.utils import console
from ctl.utils.errors import UserError
from ctl.core.hook_protocol import Hook, Run
from ctl.model_dir import ModelDir, is_published, publishing, temporaries
from ctl.core.task import default_serving_signatures

EXPORT_DIR = "export"  # In the model dir: `<name>/<step>/`, a SavedModel each.


def export_best_record_files(directory: ModelDir) -> List[str]:
    """Every `BestExporter`'s record in a model dir.

    Args:
        directory: the run's model dir.

    Returns:
        The paths of `export/*/best.json`, sorted.
    """
    return sorted(tf.io.gfile.glob(directory.file(EXPORT_DIR, "*", BEST_RECORD_FILE)))


def export_saved_model(model, signatures: Dict[str, Callable], export_dir: str) -> Optional[str]:
    """Writes `model` with `signatures` to `export_dir`, published whole; None if it was.

    Args:
        model: the model to export (tracked by the SavedModel, unless `signatures` name what is).
        signatures: the serving signatures by name (`tf.function`s with an input signature, or
            concrete functions); a `ctl.core.task.ServingSignatures` with a `module` saves that
            module in place of the model.
        export_dir: the export's directory; written to a temporary one beside it and published whole.

    Returns:
        `export_dir`, or None when a whole export is already there (nothing written).
    """
    if is_published(export_dir):
        return None
    module = tf.Module()
    owner = getattr(signatures, "module", None)  # `ctl.core.task.ServingSignatures`:
    if owner is not None:
        module.serving = owner  # what they read, saved in place of the model.
    else:
        module.model = model  # Tracks the variables the signatures read.
    with publishing(export_dir, last=["saved_model.pb"]) as temp:
        tf.saved_model.save(module, temp, signatures=signatures)
    return export_dir


class Exporter(Hook):
    """Exports the bound model to `<model_dir>/export/<name>/<step>`, keeping `max_to_keep`.

    Args:
        name: the exporter's directory under `<model_dir>/export/`.
        max_to_keep: exports kept in this exporter's directory, the newest (a positive integer).

    Raises:
        UserError: `max_to_keep` is not a positive integer.
    """

    def __init__(self, name: str, max_to_keep: int = 5):
        if isinstance(max_to_keep, bool) or not isinstance(max_to_keep, int) or max_to_keep < 1:
            raise UserError(f"{type(self).__name__}.max_to_keep ({max_to_keep!r}) must be a "
                            "positive integer.")
        self.name = name
        self.max_to_keep = max_to_keep

    @property
    def directory(self) -> str:
        return self.run.directory.file(EXPORT_DIR, self.name)

    def _step_dir(self, step: int) -> str:
        return self.run.directory.file(EXPORT_DIR, self.name, str(step))

    def exported_steps(self, published: bool = True) -> List[int]:
        """The steps exported (whole ones; all with `published=False`), oldest first.

        Args:
            published: True: only whole exports; False: every step directory, a half one a kill left too.

        Returns:
            The global steps, oldest first.
        """
        if not tf.io.gfile.isdir(self.directory):
            return []
        steps = sorted(int(name.rstrip("/")) for name in tf.io.gfile.listdir(self.directory)
                       if name.rstrip("/").isdigit())
        return [s for s in steps if not published
                or is_published(self._step_dir(s))]

    def export(self) -> Optional[str]:
        if not self.run.chief:
            return None
        path = self._step_dir(self.run.step)
        model = self.run.eval_model  # The moving average, with ctl.Trainer.ema_decay.
        if getattr(self, "_signatures", None) is None:  # Traced once, reused by every export.
            self._signatures = serving_signatures(self.run.task, model)
        written = export_saved_model(model, self._signatures, path)
        if written:
            console.info("export", "%s SavedModel: %s", self.name, written, step=self.run.step)
        kept = self.exported_steps()[-self.max_to_keep:]
        for step in self.exported_steps(published=False):
            if step not in kept:  # Retired, or half of an export a kill interrupted.
                tf.io.gfile.rmtree(self._step_dir(step))
        for temp in temporaries(self.directory):  # What a killed export left aside.
            tf.io.gfile.rmtree(temp)
        return written


def serving_signatures(task, model) -> Dict[str, Callable]:
    """The signatures an export carries: the task's `serving_signatures(model)`, else the model's default.

    Args:
        task: the run's `ctl.Task`, or None.
        model: the model exported.

    Returns:
        The signatures by name.
    """
    if task is not None and hasattr(task, "serving_signatures"):
        return task.serving_signatures(model)
    return default_serving_signatures(model)


# LatestExporter, CheckpointExporter and FinalExporter are alike but for their defaults and the event
# they export on. Each stays a class of its own, as tf.estimator's exporters are: a gin configurable
# with its own name and defaults (`ctl.hooks.FinalExporter.max_to_keep`), holding only its event's method.
@gin.configurable(module="ctl.hooks")
class LatestExporter(Exporter):
    """Exports after every evaluation.

    Args:
        max_to_keep: exports kept in this exporter's directory, the newest (a positive integer).
        name: the exporter's directory under `<model_dir>/export/`.
    """

    def __init__(self, max_to_keep: int = 5, name: str = "latest"):
        super().__init__(name, max_to_keep)

    def on_eval_end(self, unused_logs) -> None:
        """Exports the evaluated model at the current step.

        Args:
            unused_logs: the evaluation's results (not read).
        """
        self.export()


@gin.configurable(module="ctl.hooks")
class BestExporter(Exporter):
    """Exports when an evaluation beats the best `metric` so far (kept across restarts).

    Args:
        metric: the evaluation result compared, by name (`"set/name"` for a named eval set, e.g. `"val/accuracy"`).
        higher_is_better: True when a larger value is better (accuracy), False when smaller is (loss).
        max_to_keep: exports kept in this exporter's directory, the newest (a positive integer).
        name: the exporter's directory under `<model_dir>/export/`.
    """

    def __init__(self, metric: str = "loss", higher_is_better: bool = False,
                 max_to_keep: int = 1, name: str = "best"):
        super().__init__(name, max_to_keep)
        self.metric = metric
        self.higher_is_better = higher_is_better

    # Alike `EarlyStopping.bind` in shape: each hook reads, when bound, the record it keeps across
    # restarts. Two records: the best value and its export here (`BestMetric`), a count there.
    def bind(self, run: Run) -> None:
        """Reads the best value so far from `<model_dir>/export/<name>/best.json` (or starts without one).

        Args:
            run: the run's `ctl.hooks.Run` (model dir, model, step, stop request), kept as `self.run`.
        """
        super().bind(run)
        self.best = BestMetric(self.metric, self.higher_is_better,
                               self.run.directory.file(EXPORT_DIR, self.name, BEST_RECORD_FILE),
                               write=run.chief, owner="ctl.hooks.BestExporter")

    def on_eval_end(self, logs) -> None:
        """Exports the evaluated model if `logs` beat the best so far, and records the new best.

        Args:
            logs: the evaluation's results by metric name (named eval sets nested, `{set: {metric: value}}`).
        """
        if self.best.test(logs):
            path = self.export()
            self.best.commit(logs, step=self.run.step, path=path)


@gin.configurable(module="ctl.hooks")
class CheckpointExporter(Exporter):
    """Exports each checkpoint as it is saved (Determined's per-checkpoint SavedModels).

    Args:
        max_to_keep: exports kept in this exporter's directory, the newest (a positive integer).
        name: the exporter's directory under `<model_dir>/export/`.
    """

    def __init__(self, max_to_keep: int = 5, name: str = "checkpoint"):
        super().__init__(name, max_to_keep)

    def on_checkpoint_end(self, unused_path) -> None:
        """Exports the model at the step of the checkpoint just saved.

        Args:
            unused_path: the checkpoint's prefix (not read).
        """
        self.export()


@gin.configurable(module="ctl.hooks")
class FinalExporter(Exporter):
    """Exports once, when the run ends.

    Args:
        max_to_keep: exports kept in this exporter's directory, the newest (a positive integer).
        name: the exporter's directory under `<model_dir>/export/`.
    """

    def __init__(self, max_to_keep: int = 1, name: str = "final"):
        super().__init__(name, max_to_keep)

    def on_trial_close(self, unused_logs) -> None:
        """Exports the evaluated model at the last step.

        Args:
            unused_logs: the last evaluation's (or train loop's) results (not read).
        """
        self.export()


# The check that an export serves: its signatures, loaded, give what they give in memory.

SENTENCE = "the export serves this sentence"  # A text input, where the features hold no text.


def check_served(signatures: Dict[str, Callable], export_dir: str, features,
                 rtol: float = 1e-4, atol: float = 1e-5) -> Dict[str, Dict[str, Any]]:
    """Loads the SavedModel in `export_dir` and checks that each of `signatures` serves there what it
    gives in memory on one input made from `features`.

    Each signature input is the feature of its name, else the features in order (one batch of a
    task's eval dataset, `Task.features`); a feature of another dtype is cast (a float image served
    as uint8 is first scaled to 0-255), and a text input without a feature is one sentence per example.

    Args:
        signatures: the signatures exported (`serving_signatures`), by name.
        export_dir: the SavedModel's directory.
        features: the model's features on one batch.
        rtol: relative tolerance of each output.
        atol: absolute tolerance of each output.

    Returns:
        Per signature, its served outputs as NumPy arrays.

    Raises:
        AssertionError: a signature missing from the SavedModel, or an output that differs.
    """
    loaded = tf.saved_model.load(export_dir)
    served_all = {}
    for name, function in signatures.items():
        if name not in loaded.signatures:
            raise AssertionError(f"signature {name!r} missing from the exported SavedModel")
        served_signature = loaded.signatures[name]
        named = _named_specs(function, served_signature)
        values = _inputs(named, features)
        served = served_signature(**{key: value for (key, _), value in zip(named, values)})
        expected = function(*values)
        if not isinstance(expected, dict):  # Named as a SavedModel names them (`output_0`, ...).
            expected = {f"output_{k}": value for k, value in enumerate(tf.nest.flatten(expected))}
        if set(served) != set(expected):
            raise AssertionError(f"signature {name!r} serves {sorted(served)}, in memory "
                                 f"{sorted(expected)}")
        for key, value in expected.items():
            got, want = served[key].numpy(), np.asarray(value)
            if got.dtype.kind in "OSU":  # Text (a translation): the same strings.
                np.testing.assert_array_equal(got, want, err_msg=f"signature {name!r} output {key!r}")
            else:
                np.testing.assert_allclose(got, want, rtol=rtol, atol=atol,
                                           err_msg=f"signature {name!r} output {key!r}")
        served_all[name] = {key: value.numpy() for key, value in served.items()}
    return served_all


def _named_specs(function, served) -> List[Tuple[str, tf.TensorSpec]]:
    """`function`'s inputs in the order it takes them, each with its name in the SavedModel's
    signature (`served`): its spec's name, else the signature's next unclaimed name."""
    if isinstance(function, tf.types.experimental.ConcreteFunction):
        specs = [s for s in tf.nest.flatten(function.structured_input_signature)
                 if isinstance(s, tf.TensorSpec)]
    else:
        specs = list(function.input_signature)
    names = sorted(served.structured_input_signature[1])
    free = [n for n in names if n not in {spec.name for spec in specs}]
    named = []
    for spec in specs:
        name = spec.name if spec.name in names else free.pop(0)
        named.append((name, spec))
    return named


def _inputs(named: List[Tuple[str, tf.TensorSpec]], features) -> List[tf.Tensor]:
    flat = tf.nest.flatten(features)
    by_name = isinstance(features, dict) and all(
        name in features for name, spec in named if spec.dtype != tf.string)
    if not by_name and len(flat) != len(named):
        raise AssertionError(f"the serving signature takes {len(named)} inputs "
                             f"({', '.join(n for n, _ in named)}), the eval features have {len(flat)}")
    batch = int(tf.shape(flat[0])[0]) if flat and tf.rank(flat[0]) > 0 else 1
    values = []
    for k, (name, spec) in enumerate(named):
        value = features[name] if by_name and name in features else None
        if value is None and not by_name:
            value = flat[k]
        values.append(_as_spec(value, spec, batch))
    return values


def _as_spec(value, spec: tf.TensorSpec, batch: int) -> tf.Tensor:
    if spec.dtype == tf.string and (value is None or tf.as_dtype(value.dtype) != tf.string):
        return tf.constant([SENTENCE] * batch)
    value = tf.convert_to_tensor(value)
    if value.dtype == spec.dtype:
        return value
    if spec.dtype == tf.uint8 and value.dtype.is_floating:  # An image, normalized for the model.
        low, high = tf.reduce_min(value), tf.reduce_max(value)
        value = (value - low) * 255.0 / tf.maximum(high - low, 1e-6)
        return tf.cast(tf.round(value), tf.uint8)
    return tf.cast(value, spec.dtype)
