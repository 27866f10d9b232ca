"""One experiment, trained K steps by ctl and by Model Garden's own `train_lib`, numbers compared.

Both start from one initial checkpoint: the experiment's model and optimizer,
built once from a fixed seed and saved as step 0 in each model dir (Model
Garden's layout: `global_step`, `model`, `optimizer`), which each trainer
restores as the run it continues. Both read the same generated files, with the
same shuffle seed, under `tf.config.experimental.enable_op_determinism()` and
the same global seed set before each run; both train in loops of one step (a
loss summary per step) and evaluate the whole eval set once at step K. Each trainer's time from
its call to its first completed step (`train_lib_first_step_s`, `ctl_first_step_s`) is in the row
beside its whole run's (`train_lib_s`, `ctl_s`); `train_lib` runs first, in the same process. Where
their numbers differ, `train_lib` is checked against itself (bench/model_garden_zoo/repeat.py).

`python -m bench.model_garden_zoo.compare NAME --steps=K --workdir=DIR` runs
one experiment and prints its row as one JSON line (the zoo runs each row in
a process of its own).
"""

import argparse
import contextlib
import json
import math
import os
import resource
import shutil
import sys
import time
import traceback
from typing import Any, Dict, List, Optional

LOSS_TOLERANCE = 1e-5  # Relative: "same loss" below it; bit-identical is reported apart.
EVAL_TOLERANCE = 1e-5
EVAL_STEPS = 2  # Batches per evaluation of an eval set that never ends (Model Garden's mock).


def _scalars(summary_dir: str) -> Dict[str, Dict[int, float]]:
    import tensorflow as tf

    values: Dict[str, Dict[int, float]] = {}
    for path in sorted(tf.io.gfile.glob(os.path.join(summary_dir, "events.out.tfevents.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.HasField("tensor") and value.metadata.plugin_data.plugin_name == "scalars":
                    number = tf.make_ndarray(value.tensor)
                elif value.HasField("simple_value"):
                    number = value.simple_value
                else:
                    continue
                values.setdefault(value.tag, {})[event.step] = float(number)
    return values


def _seconds_per_step(rates: Dict[int, float]) -> Optional[float]:
    """The median of 1/steps-per-second over the loops after the first (which traces)."""
    import numpy as np

    later = [rate for step, rate in sorted(rates.items())[1:] if rate > 0]
    return float(np.median([1.0 / rate for rate in later])) if later else None


def _number(value) -> Optional[float]:
    import numpy as np

    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        return None
    return float(array) if array.shape == () else None


def _relative(a: float, b: float) -> float:
    """|a - b| relative to the larger; NaN on both sides is the same, on one side infinitely far."""
    if a == b or (math.isnan(a) and math.isnan(b)):
        return 0.0
    if math.isnan(a) or math.isnan(b):
        return math.inf
    return abs(a - b) / max(abs(a), abs(b), 1e-12)


NOISE = ("Graph execution error:", "in user code:", "Detected at node", "<stack traces", "[[", "File ",
         "^", "raise ", "return ")


def _message(error) -> str:
    """The line of an error's message that says what went wrong (TensorFlow wraps it in
    "in user code:" tracebacks and "Graph execution error:" node lists)."""
    lines = [line.strip() for line in str(error).strip().splitlines()]
    lines = [line for line in lines if line and not line.startswith(NOISE)]
    errors = [line for line in lines if "Error" in line or "error" in line]
    return (errors or lines or [""])[-1]


def params_for(experiment: str, steps: int, data_dir: str, eval_steps: int = -1):
    """The tiny variant's overrides, with its data, trained `steps` in loops of one step."""
    from bench.model_garden_zoo import data, variants

    schedule = {"trainer": {"train_steps": steps, "steps_per_loop": 1, "summary_interval": 1,
                            "checkpoint_interval": steps, "validation_interval": steps,
                            "validation_steps": eval_steps, "max_to_keep": 2}}
    return variants.overrides(experiment, steps) + data.data_overrides(experiment, data_dir) + [schedule]


def eval_steps_of(task) -> int:
    """-1 (the whole set) for an eval set that ends, else EVAL_STEPS."""
    import tensorflow as tf

    dataset = task.build_inputs(training=False)
    return EVAL_STEPS if dataset.cardinality() == tf.data.INFINITE_CARDINALITY else -1


def write_initial_checkpoint(experiment: str, overrides, model_dirs: List[str]) -> int:
    """Step 0 of a run, as Model Garden's trainer lays it out, in each of `model_dirs`; returns the
    eval steps (`eval_steps_of`)."""
    import tensorflow as tf
    import tf_keras

    import ctl

    tf_keras.utils.set_random_seed(0)  # Before the task: see run_train_lib.
    task = ctl.ModelGardenTask(experiment=experiment, params_override=overrides)
    model = task.build_model()
    # Every variable in the checkpoint: some models make theirs on their first call (BERT's
    # heads). A model whose call takes more than the features (Mask R-CNN's) was built whole.
    try:
        model(task.features(next(iter(task.build_inputs(training=True)))), training=False)
    except TypeError:  # Its call takes more arguments: its task built it whole.
        pass
    checkpoint = tf.train.Checkpoint(global_step=tf.Variable(0, dtype=tf.int64), model=model,
                                     optimizer=task.build_optimizer())
    for directory in model_dirs:
        tf.train.CheckpointManager(checkpoint, directory, max_to_keep=2).save(checkpoint_number=0)
    return eval_steps_of(task)


@contextlib.contextmanager
def first_step(owner, method: str, start: float):
    """Within it, the yielded list gets the seconds from `start` (`time.perf_counter()`) to the
    end of the first call of `owner.method`: a trainer's train loop, one step in a zoo row
    (`orbit.StandardTrainer.train`, which Model Garden's trainer runs; `ctl.core.trainer.Trainer.train`)."""
    seconds: List[float] = []
    loop = getattr(owner, method)

    def timed(*args, **kwargs):
        result = loop(*args, **kwargs)
        if not seconds:
            seconds.append(time.perf_counter() - start)
        return result

    setattr(owner, method, timed)
    try:
        yield seconds
    finally:
        setattr(owner, method, loop)


def run_train_lib(params, model_dir: str) -> Dict[str, Any]:
    import tf_keras
    from official.core import train_lib

    tf_keras.utils.set_random_seed(1)
    # Not reseeded as it builds its model (the restore sets every weight): tf.random.set_seed
    # clears TensorFlow's kernel cache, and with it resources that tasks made (the WMT task's
    # SentencePiece tokenizer).
    strategy, task, trainer = train_py_setup(params, model_dir)
    model, _ = train_lib.run_experiment(
        distribution_strategy=strategy, task=task, mode="train_and_eval",
        params=params, model_dir=model_dir, trainer=trainer)
    found = _scalars(os.path.join(model_dir, "validation"))
    step = params.trainer.train_steps
    return {tag: values[step] for tag, values in found.items() if step in values}, _weights(model)


def train_py_setup(params, model_dir: str, strategy=None):
    """What Model Garden's train.py builds before `train_lib.run_experiment`: the strategy it makes from
    the experiment's runtime (on this host a MirroredStrategy of the one CPU), as its users run it (its
    trainer needs one for some configs: swapping in the moving average of an `ema` optimizer before
    each eval), and under it the task and the trainer (`_ranking_trainer`).

    Args:
      params: the experiment's config.
      model_dir: the run's model dir.
      strategy: a strategy of the caller's (None: the one train.py makes from `params.runtime`).

    Returns:
      (strategy, task, trainer).
    """
    from official.common import distribute_utils

    from ctl.adapters import model_garden

    if strategy is None:
        strategy = distribute_utils.get_distribution_strategy(
            distribution_strategy=params.runtime.distribution_strategy,
            all_reduce_alg=params.runtime.all_reduce_alg, num_gpus=params.runtime.num_gpus,
            tpu_address=params.runtime.tpu)
    with strategy.scope():
        task = model_garden.garden_task(params, logging_dir=model_dir)
        trainer = _ranking_trainer(params, task, model_dir)
    return strategy, task, trainer


def _ranking_trainer(params, task, model_dir: str):
    """The ranking experiments' own trainer, as their train.py builds it (others: None, train_lib's),
    its best checkpoint (where the config keeps one) in `model_dir`."""
    if type(task).__name__ != "RankingTask":
        return None
    import tensorflow as tf
    from official.core import train_utils
    from official.recommendation.ranking.train import RankingTrainer

    model = task.build_model()

    def dataset(data):
        return tf.distribute.get_strategy().distribute_datasets_from_function(
            lambda context: task.build_inputs(data, context))

    return RankingTrainer(config=params, task=task, model=model, optimizer=model.optimizer,
                          train=True, evaluate=True, train_dataset=dataset(params.task.train_data),
                          validation_dataset=dataset(params.task.validation_data),
                          checkpoint_exporter=train_utils.maybe_create_best_ckpt_exporter(params, model_dir))


def _weights(model) -> List[Any]:
    """(name, value) of each of the model's weights, in the model's order."""
    return [(w.name, w.numpy()) for w in model.weights]


def weights_difference(ctl_weights, garden_weights) -> str:
    """'' where both trainers' weights are the same bit for bit, else the first that is not."""
    if len(ctl_weights) != len(garden_weights) or not ctl_weights:
        return f"{len(ctl_weights)} weights (ctl) vs {len(garden_weights)} (train_lib)"
    for (name, a), (_, b) in zip(ctl_weights, garden_weights):
        if a.shape != b.shape:
            return f"{name}: shape {a.shape} (ctl) vs {b.shape} (train_lib)"
        if not (a == b).all():
            differ = int((a != b).sum())
            return (f"{name}: {differ} of {a.size} values differ, by up to "
                    f"{float(abs(a.astype('float64') - b).max()):.3g}")
    return ""


def run_ctl(experiment: str, overrides, steps: int, model_dir: str, eval_steps: int):
    import tf_keras

    import ctl

    class Weights(ctl.hooks.Hook):
        trained: List[Any] = []

        def on_trial_close(self, unused_logs):
            self.trained = _weights(self.run.model)

    tf_keras.utils.set_random_seed(1)
    task = ctl.ModelGardenTask(experiment=experiment, params_override=overrides, logging_dir=model_dir)
    schedule = ctl.Schedule(train_steps=steps, steps_per_loop=1, eval_interval=steps,
                            checkpoint_interval=steps,
                            eval_steps=eval_steps if eval_steps > 0 else None)
    weights = Weights()
    # Where the experiment's trainer keeps its best checkpoint (and reports `best_<metric>`),
    # ctl keeps one by the same metric: its record's value is ctl's `best_<metric>`.
    trainer = task.params.trainer
    best = trainer.best_checkpoint_eval_metric if trainer.best_checkpoint_export_subdir else ""
    hooks: List[Any] = [weights] + ([ctl.hooks.BestCheckpoint(
        metric=best, higher_is_better=trainer.best_checkpoint_metric_comp == "higher")] if best else [])
    results = dict(ctl.run_experiment("train_and_eval", model_dir, experiment=ctl.Experiment(
        task=task, schedule=schedule, hooks=hooks)) or {})
    if best:
        from ctl.hooks.best import best_record
        from ctl.model_dir import ModelDir

        results["best_" + best] = best_record(ModelDir(model_dir)).get("value")
    return results, weights.trained


def _train_losses(model_dir: str, tags) -> Dict[int, float]:
    found = _scalars(os.path.join(model_dir, "train"))
    for tag in tags:
        if tag in found:
            return found[tag]
    return {}


def _rates(model_dir: str) -> Dict[int, float]:
    found = _scalars(os.path.join(model_dir, "train"))
    return found.get("steps_per_second", found.get("steps/sec", {}))


def compare(experiment: str, steps: int, workdir: str, determinism: bool = True) -> Dict[str, Any]:
    """Trains `experiment`'s tiny variant both ways from one checkpoint; returns its row.

    Args:
      experiment: a registered experiment's name.
      steps: training steps each way (K).
      workdir: for the data (kept between experiments) and this experiment's two model dirs.
      determinism: whether to call `tf.config.experimental.enable_op_determinism()`.
    """
    import tensorflow as tf

    from ctl.adapters import model_garden

    row: Dict[str, Any] = {"experiment": experiment, "trains": False, "same_loss": False,
                           "max_rel_loss_diff": None, "same_eval": False, "ctl_s_per_step": None,
                           "train_lib_s_per_step": None, "reason": ""}
    if determinism:
        tf.config.experimental.enable_op_determinism()
    row["op_determinism"] = determinism
    name = experiment.replace("/", "_")
    dirs = {"train_lib": os.path.join(workdir, "runs", name, "train_lib"),
            "ctl": os.path.join(workdir, "runs", name, "ctl"),
            "train_lib_again": os.path.join(workdir, "runs", name, "train_lib_again")}
    for directory in dirs.values():  # A fresh start (a row may be run again).
        shutil.rmtree(directory, ignore_errors=True)
    stage = "building the config"
    try:
        overrides = params_for(experiment, steps, os.path.join(workdir, "data"))
        stage = "writing the initial checkpoint"
        eval_steps = write_initial_checkpoint(experiment, overrides, list(dirs.values()))
        overrides = params_for(experiment, steps, os.path.join(workdir, "data"), eval_steps)
        params = model_garden.experiment_config(experiment, params_override=overrides)
    except Exception as error:  # The row says why, in a line a user can check.
        row["reason"] = f"{stage}: {type(error).__name__}: {_message(error)[:300]}"
        traceback.print_exc()
        return row
    # Each trainer on its own: ctl's row says whether it trains even where train_lib fails.
    garden_eval, garden_weights, garden_failed = {}, [], ""
    import orbit

    from ctl.core.trainer import Trainer

    try:
        start = time.perf_counter()
        with first_step(orbit.StandardTrainer, "train", start) as seconds:
            garden_eval, garden_weights = run_train_lib(params, dirs["train_lib"])
        row["train_lib_s"] = round(time.perf_counter() - start, 1)
        row["train_lib_first_step_s"] = round(seconds[0], 1) if seconds else None
    except Exception as error:
        garden_failed = f"train_lib fails: {type(error).__name__}: {_message(error)[:300]}"
        traceback.print_exc()
        if determinism and "make_deterministic" in str(error):  # The zoo runs it again without.
            row["reason"] = garden_failed
            return row
    try:
        start = time.perf_counter()
        with first_step(Trainer, "train", start) as seconds:
            ctl_eval, ctl_weights = run_ctl(experiment, overrides, steps, dirs["ctl"], eval_steps)
        row["ctl_s"] = round(time.perf_counter() - start, 1)
        row["ctl_first_step_s"] = round(seconds[0], 1) if seconds else None
    except Exception as error:
        row["reason"] = "; ".join(filter(None, [
            f"ctl: {type(error).__name__}: {_message(error)[:300]}", garden_failed]))
        traceback.print_exc()
        return row
    if garden_failed:  # Nothing to compare with.
        row["trains"] = sorted(_train_losses(dirs["ctl"], ["loss"])) == list(range(1, steps + 1))
        row["reason"] = garden_failed + " (so nothing to compare; ctl " + (
            "trains)" if row["trains"] else "wrote no loss at every step)")
        row["ctl_s_per_step"] = _seconds_per_step(_rates(dirs["ctl"]))
        return row
    ctl_losses = _train_losses(dirs["ctl"], ["loss"])
    garden_losses = _train_losses(dirs["train_lib"], ["training_loss", "loss"])
    row["trains"] = sorted(ctl_losses) == list(range(1, steps + 1))
    shared = sorted(set(ctl_losses) & set(garden_losses))
    if row["trains"] and len(shared) == steps:
        diffs = [_relative(ctl_losses[s], garden_losses[s]) for s in shared]
        row["max_rel_loss_diff"] = max(diffs)
        row["same_loss"] = row["max_rel_loss_diff"] <= LOSS_TOLERANCE
        row["bit_identical_loss"] = row["max_rel_loss_diff"] == 0.0
    else:
        row["reason"] = (f"loss summaries at steps ctl {sorted(ctl_losses)}, "
                         f"train_lib {sorted(garden_losses)}")
    difference = weights_difference(ctl_weights, garden_weights)
    row["same_weights"] = not difference
    if difference:
        row["weights_difference"] = difference
    row["losses"] = {"ctl": [ctl_losses.get(s) for s in range(1, steps + 1)],
                     "train_lib": [garden_losses.get(s) for s in range(1, steps + 1)]}
    evals = {}
    # train_lib's eval loss mean is `validation_loss`, ctl's `loss`; a task whose aggregation
    # reports a `loss` of its own (Model Garden's mock) has it as `loss` on both sides (ctl's
    # mean is then its `mean_loss`), as the page says.
    own_loss = "loss" in garden_eval
    for key, value in garden_eval.items():
        if key == "steps_per_second" or (key == "validation_loss" and own_loss):
            continue
        theirs = _number(value)
        ours = _number(ctl_eval.get("loss" if key == "validation_loss" else key))
        if theirs is not None:
            evals[key] = [ours, theirs]
    row["eval"] = evals
    diffs = [_relative(a, b) for a, b in evals.values() if a is not None]
    missing = [key for key, (a, _) in evals.items() if a is None]
    row["same_eval"] = bool(evals) and not missing and max(diffs) <= EVAL_TOLERANCE
    row["bit_identical_eval"] = bool(evals) and not missing and max(diffs) == 0.0
    differing = {key: pair for key, pair in evals.items()
                 if pair[0] is not None and _relative(*pair) > EVAL_TOLERANCE}
    if differing:
        row["reason"] = (row["reason"] + "; " if row["reason"] else "") + "eval differs: " + ", ".join(
            f"{key} {a:.6g} (ctl) vs {b:.6g} (train_lib)" for key, (a, b) in differing.items())
    if row["trains"] and not row["same_loss"]:
        row["reason"] = (row["reason"] + "; " if row["reason"] else "") + \
            f"training losses differ (max relative difference {row['max_rel_loss_diff']:.2e})"
    if missing:
        row["reason"] = (row["reason"] + "; " if row["reason"] else "") + \
            f"eval metrics missing from ctl's results: {missing}"
    if row["trains"] and not (row["same_loss"] and row["same_eval"]):
        row["train_lib_again"] = train_lib_again(params, dirs["train_lib_again"], garden_losses,
                                                 garden_eval)
        from bench.model_garden_zoo import repeat

        itself = repeat.reason(row["train_lib_again"], LOSS_TOLERANCE)
        row["reason"] = "; ".join(filter(None, [row["reason"], itself]))
    row["ctl_s_per_step"] = _seconds_per_step(_rates(dirs["ctl"]))
    row["train_lib_s_per_step"] = _seconds_per_step(_rates(dirs["train_lib"]))
    return row


def train_lib_again(params, model_dir: str, losses: Dict[int, float],
                    evals: Dict[str, Any]) -> Dict[str, Any]:
    """The A/A: train_lib run again from the same initial checkpoint (in `model_dir`), files
    and seed, against its first run; and its train dataset built again (`repeat`).

    Args:
      params: the experiment's config, as the first run had it.
      model_dir: a model dir holding the same initial checkpoint as the first run's.
      losses: the first run's training loss at each step.
      evals: the first run's eval metrics.
    """
    from bench.model_garden_zoo import repeat
    from ctl.adapters import model_garden

    again_eval, _ = run_train_lib(params, model_dir)
    again = _train_losses(model_dir, ["training_loss", "loss"])
    steps = sorted(set(losses) & set(again))
    pairs = {key: [_number(value), _number(again_eval.get(key))] for key, value in evals.items()
             if key != "steps_per_second" and _number(value) is not None}
    batch = repeat.first_differing_batch(
        lambda: model_garden.garden_task(params).build_inputs(params.task.train_data),
        params.trainer.train_steps)
    return {"losses": [again.get(step) for step in steps],
            "max_rel_loss_diff": max((_relative(losses[s], again[s]) for s in steps), default=None),
            "eval": pairs,
            "first_differing_batch": batch}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("experiment")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--no_determinism", action="store_true",
                        help="without tf.config.experimental.enable_op_determinism()")
    args = parser.parse_args(argv)
    from bench.model_garden_zoo import registry

    failed = registry.import_all()
    row = compare(args.experiment, args.steps, args.workdir, determinism=not args.no_determinism)
    if not row["trains"] and failed and "is not registered" in row["reason"]:
        row["reason"] += f" (imports that failed: {failed})"  # Why it may not be.
    usage = resource.getrusage(resource.RUSAGE_SELF)  # Every thread of the row's process.
    row["cpu_s"] = round(usage.ru_utime + usage.ru_stime, 1)
    print("ZOO-ROW " + json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
