"""One experiment through `python -m ctl.train`, as a user runs it, against Model Garden's trainer.

    python -m bench.model_garden_zoo.command NAME --workdir=DIR [--metrics=NAME,NAME]

The experiment's tiny variant (the zoo's: bench/model_garden_zoo/variants.py, on the generated
files of data.py) is written as one YAML file with trainer settings of its own (`TRAINER`: loops,
checkpoints, evaluations and retention at steps apart from one another) and, where the experiment
has an eval metric to rank by, a best checkpoint (`best_checkpoint`). One initial checkpoint
(`write_initial_checkpoint`) goes into two model dirs; then, each in its own process:

- ctl:       `python -m ctl.train --experiment=NAME --mode=train_and_eval --model_dir=DIR
              --config_file=NAME.yaml --gin_bindings=ctl.FaultTolerance.seed=1`
- train_lib: this module with `--train_lib`: what Model Garden's train.py does with the same
             flags (`train_utils.parse_configuration`, `serialize_config`, the mixed-precision
             policy, the strategy of the experiment's runtime, `train_lib.run_experiment`; the
             ranking experiments' own trainer), seeded as the seed binding seeds ctl's process.

The seed is the one flag beyond the user's: a YAML has no seed, and without one two runs of
Model Garden's own train.py draw other dropout masks and augmentations (and under op determinism
refuse to draw at all). Then `checks` compares the two model dirs: the training loss at each loop's
end, every evaluation's metrics, the checkpoints kept, the steps evaluated and the best checkpoint
(`best_ckpt/` and its `info.json`), against Model Garden's and against the YAML's steps
(`schedule`). Prints `ZOO-COMMAND {"experiment", "command", "command_checks",
"command_reason", ...}`; `python -m bench.model_garden_zoo --command` runs it per row.
"""

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
import traceback
from typing import Any, Dict, List, Optional, Sequence, Tuple

from bench.model_garden_zoo import compare

# The YAML's trainer settings: 4 loops of 2 steps, a checkpoint every 4 steps (of which 2 are
# kept: the initial checkpoint is retired), an evaluation every 6 (and at the end).
TRAINER = {"train_steps": 8, "steps_per_loop": 2, "summary_interval": 2, "checkpoint_interval": 4,
           "validation_interval": 6, "max_to_keep": 2}
SEED = 1
SEED_BINDING = f"--gin_bindings=ctl.FaultTolerance.seed={SEED}"
BEST_SUBDIR = "best_ckpt"
CHECKS = ("runs", "loss", "eval", "checkpoints", "evaluations", "best")
BUDGET_S = 2300  # The row's processes in all, by default (the zoo gives the row 2400 s).
RANDOM_OPS_LINE = "the eval step draws from stateful random ops ("  # ctl.core.evaluation's line.


def merged(overrides: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """`overrides` (params_override dicts) as one dict, each applied over the ones before it, as
    Model Garden applies a list of overrides (nested dicts merged, anything else replaced).

    Args:
      overrides: the dicts, in order.
    """
    def merge(into: Dict[str, Any], update: Dict[str, Any]) -> Dict[str, Any]:
        for key, value in update.items():
            if isinstance(value, dict) and isinstance(into.get(key), dict):
                merge(into[key], value)
            else:
                into[key] = json.loads(json.dumps(value))  # A copy, with tuples as lists.
        return into

    out: Dict[str, Any] = {}
    for override in overrides:
        merge(out, override)
    return out


def best_checkpoint(own: Dict[str, Any], metrics: Sequence[str]) -> Dict[str, Any]:
    """The YAML's best checkpoint settings: the experiment's own if it keeps one, else by
    `validation_loss` (lower) where Model Garden's evaluation reports it, else by the first metric
    it reports (lower for a loss, higher otherwise); {} without a metric.

    Args:
      own: the experiment's `trainer` settings (`best_checkpoint_export_subdir`, ...).
      metrics: the metrics Model Garden's evaluation of the experiment reports, in its order.
    """
    if own.get("best_checkpoint_export_subdir") and own.get("best_checkpoint_eval_metric"):
        metric, comp = own["best_checkpoint_eval_metric"], own["best_checkpoint_metric_comp"]
    elif "validation_loss" in metrics:
        metric, comp = "validation_loss", "lower"
    elif metrics:
        metric = metrics[0]
        comp = "lower" if "loss" in metric else "higher"
    else:
        return {}
    return {"best_checkpoint_export_subdir": BEST_SUBDIR, "best_checkpoint_eval_metric": metric,
            "best_checkpoint_metric_comp": comp}


def schedule(trainer: Dict[str, Any]) -> Dict[str, List[int]]:
    """The steps of a run that restores step 0 under Model Garden's trainer (orbit's
    `Controller.train_and_evaluate`, TensorFlow's `CheckpointManager`): where its train loops end,
    where it evaluates, where it saves a checkpoint and which checkpoints it keeps.

    Args:
      trainer: `train_steps`, `steps_per_loop`, `validation_interval`, `checkpoint_interval`,
        `max_to_keep`.
    """
    steps, loop = trainer["train_steps"], trainer["steps_per_loop"]
    loops: List[int] = []
    evaluations: List[int] = []
    saved: List[int] = []
    step = last_saved = 0
    while step < steps:
        target = min(steps, step + trainer["validation_interval"])
        while step < target:  # A loop ends at the evaluation's step at the latest.
            step = min(step + loop, target)
            loops.append(step)
            if step - last_saved >= trainer["checkpoint_interval"]:
                saved.append(step)
                last_saved = step
        evaluations.append(step)
    if not saved or saved[-1] != steps:  # The last step is saved at the end.
        saved.append(steps)
    return {"loops": loops, "evaluations": evaluations, "checkpoints": saved,
            "kept": ([0] + saved)[-trainer["max_to_keep"]:]}


def step_reasons(expected: Dict[str, List[int]], found: Dict[str, Dict[str, List[int]]]) -> Dict[str, str]:
    """Why the checkpoints kept and the steps evaluated are not the YAML's ('' where they are).

    Args:
      expected: `schedule`'s answer.
      found: per trainer (`ctl`, `train_lib`), the `kept` checkpoints and the `evaluations`' steps.
    """
    reasons = {}
    for check, key, what in (("checkpoints", "kept", "checkpoints kept"),
                             ("evaluations", "evaluations", "evaluations at steps")):
        wrong = [f"{trainer} {found[trainer][key]}" for trainer in ("ctl", "train_lib")
                 if found[trainer][key] != expected[key]]
        reasons[check] = (f"{what} {', '.join(wrong)}, the YAML's {expected[key]}" if wrong else "")
    return reasons


def write_yaml(path: str, config: Dict[str, Any]) -> str:
    """Writes `config` as a YAML file (as a user keeps one); returns its path.

    Args:
      path: the file.
      config: the experiment's overrides as one dict (`config`).
    """
    import yaml

    with open(path, "w") as f:
        yaml.safe_dump(config, f, sort_keys=False)
    return path


def config(experiment: str, data_dir: str, metrics: Sequence[str], eval_steps: int = -1) -> Dict[str, Any]:
    """The YAML of `experiment`'s tiny variant with the zoo's trainer settings and best checkpoint.

    Args:
      experiment: a registered experiment's name.
      data_dir: the zoo's generated files.
      metrics: the metrics Model Garden's evaluation reports (for `best_checkpoint`).
      eval_steps: `trainer.validation_steps` (-1: the whole eval set).
    """
    from official.core import exp_factory

    from bench.model_garden_zoo import data, variants

    base = exp_factory.get_exp_config(experiment)
    overrides = variants.overrides(experiment, TRAINER["train_steps"]) + data.data_overrides(
        experiment, data_dir)
    if getattr(base.task, "init_checkpoint", ""):
        # Never read (the run restores step 0), and in a public bucket: nothing is downloaded.
        overrides.append({"task": {"init_checkpoint": ""}})
    trainer = dict(TRAINER, validation_steps=eval_steps,
                   **best_checkpoint(base.trainer.as_dict(), metrics))
    return merged(overrides + [{"trainer": trainer}])


def write_initial_checkpoint(experiment: str, yaml_config: Dict[str, Any],
                             model_dirs: Sequence[str]) -> int:
    """Step 0 of both runs in each of `model_dirs`, as Model Garden's trainer lays it out
    (`global_step`, `model`, `optimizer`: no `rng`); returns the eval steps
    (`compare.eval_steps_of`).

    Without the states of the generators tf_keras' dropout draws from (`rng`), each trainer's
    generators start from the seed both processes get (`SEED`), as they do in a model dir of
    Model Garden's that a user brings: ctl restores the checkpoint with a line saying so.
    With them, ctl would draw from the states this process made, and Model Garden's trainer
    from its own: a layer built on the model's first call (BERT's pretraining heads) makes its
    generator here, eagerly, after its initializers drew their seeds from the same seeded
    stream, while both trainers make it as their first step is traced, where the restore gives
    its weights their values and no initializer draws.

    Args:
      experiment: a registered experiment's name.
      yaml_config: the YAML's contents (without `trainer.validation_steps`).
      model_dirs: where to write it.
    """
    import tensorflow as tf

    import ctl
    from ctl.faults import resume

    resume.seed_everything(SEED)
    task = ctl.ModelGardenTask(experiment=experiment, params_override=[yaml_config])
    model = task.build_model()
    try:  # Every variable in the checkpoint (see compare.write_initial_checkpoint).
        model(task.features(next(iter(task.build_inputs(training=True)))), training=False)
    except TypeError:
        pass
    checkpoint = tf.train.Checkpoint(global_step=tf.Variable(0, dtype=tf.int64), model=model,
                                     optimizer=task.build_optimizer())
    for directory in model_dirs:
        tf.train.CheckpointManager(checkpoint, directory, max_to_keep=2).save(checkpoint_number=0)
    return compare.eval_steps_of(task)


def run_train_lib(experiment: str, config_file: str, model_dir: str,
                  mode: str = "train_and_eval") -> None:
    """Model Garden's train.py with `--mode=train_and_eval` (or `mode`), seeded as ctl's process is.

    Args:
      experiment: `--experiment`.
      config_file: `--config_file`.
      model_dir: `--model_dir`.
      mode: `--mode`: `train_and_eval`, or `eval` (the latest checkpoint, once).
    """
    from official.core import train_lib, train_utils
    from official.modeling import performance
    from official.vision.utils import summary_manager

    from ctl.faults import resume

    flags = argparse.Namespace(experiment=experiment, config_file=[config_file], tpu=None,
                               tf_data_service=None, params_override=None)
    params = train_utils.parse_configuration(flags)
    train_utils.serialize_config(params, model_dir)
    if params.runtime.mixed_precision_dtype:
        performance.set_mixed_precision_policy(params.runtime.mixed_precision_dtype)
    # As `ctl.FaultTolerance.seed` seeds ctl's process before its task is built: Python, NumPy,
    # TensorFlow and tf_keras (whose dropout then draws from generators), and op determinism.
    resume.seed_everything(SEED)
    strategy, task, trainer = compare.train_py_setup(params, model_dir)
    train_lib.run_experiment(
        distribution_strategy=strategy, task=task, mode=mode, params=params,
        model_dir=model_dir, trainer=trainer, summary_manager=None,
        eval_summary_manager=summary_manager.maybe_build_eval_summary_manager(params, model_dir),
        enable_async_checkpointing=True)


def _kept(model_dir: str) -> List[int]:
    """The steps of the checkpoints in `model_dir` (`ckpt-N.index`)."""
    import tensorflow as tf

    names = [os.path.basename(p) for p in tf.io.gfile.glob(os.path.join(model_dir, "ckpt-*.index"))]
    return sorted(int(name[len("ckpt-"):-len(".index")]) for name in names)


def _evaluations(model_dir: str) -> Dict[str, Dict[int, float]]:
    """Each metric of the evaluation summaries in Model Garden's `validation/`, by step."""
    found = compare._scalars(os.path.join(model_dir, "validation"))
    found.pop("steps_per_second", None)
    return found


def _roots(path: str) -> List[str]:
    """The top-level objects of the checkpoint at `path` (`global_step`, `model`, ...)."""
    import tensorflow as tf

    from ctl.core.checkpoint_contents import SavedGraph

    return SavedGraph(tf.train.load_checkpoint(path)).root_children()


def _lacks(ours: Optional[str], theirs: Optional[str], what: str) -> str:
    """Which of the top-level objects of train_lib's checkpoint `theirs` ctl's `ours` lacks
    (Model Garden's trainer adds the model's `checkpoint_items`, e.g. BERT's `encoder`, which
    its tools read); '' if none."""
    if not ours or not theirs:
        return f"no {what} (ctl {ours and os.path.basename(ours)}, train_lib {theirs and os.path.basename(theirs)})"
    missing = sorted(set(_roots(theirs)) - set(_roots(ours)))
    return (f"ctl's {os.path.basename(ours)} lacks train_lib's top-level {', '.join(missing)}"
            if missing else "")


def _best(model_dir: str) -> Dict[str, Any]:
    """`best_ckpt/info.json`, and the step and path of the checkpoint beside it."""
    import tensorflow as tf

    directory = os.path.join(model_dir, BEST_SUBDIR)
    info_path = os.path.join(directory, "info.json")
    if not tf.io.gfile.exists(info_path):
        return {}
    with tf.io.gfile.GFile(info_path) as f:
        out: Dict[str, Any] = {"info": json.load(f)}
    out["path"] = tf.train.latest_checkpoint(directory)
    if out["path"]:
        reader = tf.train.load_checkpoint(out["path"])
        step_key = "global_step/.ATTRIBUTES/VARIABLE_VALUE"
        out["step"] = (int(reader.get_tensor(step_key))
                       if step_key in reader.get_variable_to_shape_map() else None)
    return out


def _differing(ours: Dict[str, Any], theirs: Dict[str, Any], tolerance: float) -> List[str]:
    """`name a (ctl) vs b (train_lib)` for each of `theirs` that differs in `ours`, `name missing`
    for each `ours` lacks."""
    said = []
    for name, value in theirs.items():
        mine = None if ours.get(name) is None else compare._number(ours[name])
        if mine is None:
            said.append(f"{name} not in ctl's")
        elif compare._relative(mine, float(value)) > tolerance:
            said.append(f"{name} {mine:.6g} (ctl) vs {float(value):.6g} (train_lib)")
    return said


def _first_three(said: List[str]) -> str:
    return ", ".join(said[:3]) + (f" (and {len(said) - 3} more)" if len(said) > 3 else "")


def checks(dirs: Dict[str, str], trainer: Dict[str, Any]) -> Dict[str, Any]:
    """The two model dirs compared with each other and with the YAML's steps.

    Args:
      dirs: `ctl` and `train_lib` -> the model dir each trainer wrote.
      trainer: the YAML's trainer settings.

    Returns:
      `{"command_checks": {check: bool}, "command_reasons": {check: one line}, ...}`, the
      reasons of the checks that hold ''.
    """
    expected = schedule(trainer)
    reasons: Dict[str, str] = {}
    out: Dict[str, Any] = {}
    # The training loss at each loop's end (ctl's `loss`, Model Garden's `training_loss`).
    losses = {"ctl": compare._train_losses(dirs["ctl"], ["loss"]),
              "train_lib": compare._train_losses(dirs["train_lib"], ["training_loss", "loss"])}
    if sorted(losses["train_lib"]) != expected["loops"] or sorted(losses["ctl"]) != expected["loops"]:
        reasons["loss"] = (f"loss summaries at steps ctl {sorted(losses['ctl'])}, train_lib "
                           f"{sorted(losses['train_lib'])}, the loops' ends {expected['loops']}")
    else:
        diff = max(compare._relative(losses["ctl"][s], losses["train_lib"][s]) for s in expected["loops"])
        out["command_max_rel_loss_diff"] = diff
        if diff > compare.LOSS_TOLERANCE:
            reasons["loss"] = f"training losses differ (max relative difference {diff:.2e})"
    out["command_losses"] = {name: [values.get(s) for s in expected["loops"]]
                             for name, values in losses.items()}
    # Every evaluation's metrics, at the steps Model Garden's trainer evaluated.
    evals = {name: _evaluations(directory) for name, directory in dirs.items()}
    differing = []
    for metric, values in evals["train_lib"].items():
        if metric.startswith("best_"):  # Model Garden's record of the best: compared below.
            continue
        ours = evals["ctl"].get(metric, {})
        for step, value in sorted(values.items()):  # Each metric's first step that differs.
            said = _differing({metric: ours.get(step)}, {metric: value}, compare.EVAL_TOLERANCE)
            if said:
                differing.append(f"{said[0]} at step {step}")
                break
    if not evals["train_lib"]:
        reasons["eval"] = "train_lib wrote no evaluation summaries in validation/"
    elif differing:
        reasons["eval"] = "validation/ differs: " + _first_three(differing)
    found = {name: {"kept": _kept(directory),
                    "evaluations": sorted({s for values in evals[name].values() for s in values})}
             for name, directory in dirs.items()}
    reasons.update(step_reasons(expected, found))
    # The last checkpoint holds what Model Garden's holds (its tools read those objects).
    import tensorflow as tf

    lacks = _lacks(*(tf.train.latest_checkpoint(dirs[name]) for name in ("ctl", "train_lib")),
                   "last checkpoint")
    reasons["checkpoints"] = "; ".join(filter(None, [reasons["checkpoints"], lacks]))
    # The best checkpoint: where Model Garden's trainer put it, with what it recorded.
    best = {name: _best(directory) for name, directory in dirs.items()}
    if "best_checkpoint_eval_metric" not in trainer:
        reasons["best"] = ""
    elif not best["train_lib"]:
        reasons["best"] = f"train_lib wrote no {BEST_SUBDIR}/info.json"
    elif not best["ctl"]:
        reasons["best"] = f"ctl wrote no {BEST_SUBDIR}/info.json"
    else:
        step = best["train_lib"]["info"].get("best_ckpt_global_step")
        said = []
        if best["ctl"]["info"].get("best_ckpt_global_step") != step:
            said.append(f"at step {best['ctl']['info'].get('best_ckpt_global_step')} (ctl) vs "
                        f"{step} (train_lib)")
        if best["ctl"].get("step") != step:
            said.append(f"ctl's {BEST_SUBDIR}/ checkpoint is of step {best['ctl'].get('step')}")
        lacks = _lacks(best["ctl"].get("path"), best["train_lib"].get("path"), "best checkpoint")
        if lacks:
            said.append(lacks)
        info = {k: v for k, v in best["train_lib"]["info"].items() if k != "best_ckpt_global_step"}
        recorded = _differing(best["ctl"]["info"], info, compare.EVAL_TOLERANCE)
        if recorded:
            said.append("info.json: " + _first_three(recorded))
        reasons["best"] = ("best checkpoint: " + "; ".join(said)) if said else ""
        found["ctl"]["best_step"] = best["ctl"]["info"].get("best_ckpt_global_step")
        found["train_lib"]["best_step"] = step
    out["command_found"] = found
    out["command_reasons"] = reasons
    return out


def _last_line(log: str) -> str:
    """The last line of `log` that says something (gin's "In call to configurable" line, which
    it adds under an error raised in a configurable, is not one)."""
    with open(log) as f:
        lines = [line.strip() for line in f
                 if line.strip() and not line.strip().startswith("In call to configurable")]
    return (lines or ["no output"])[-1][:300]


def first_loop_s(model_dir: str, launched: float, step: int) -> Optional[float]:
    """Seconds from `launched` (`time.time()` before the trainer's process started) to the end of
    its first train loop: the wall time of the first of that loop's summaries in `model_dir`'s
    `train/` (both trainers write them as the loop ends); None without one.

    Args:
      model_dir: a trainer's model dir.
      launched: when its process was started.
      step: the step the first loop ends at.
    """
    import tensorflow as tf

    times = [event.wall_time
             for path in tf.io.gfile.glob(os.path.join(model_dir, "train", "events.out.tfevents.*"))
             for event in tf.compat.v1.train.summary_iterator(path)
             if event.step == step and event.summary.value]
    return round(min(times) - launched, 2) if times else None


def _children_cpu_s() -> float:
    """User and system seconds of this process's ended children so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run(command: List[str], log: str, env: Dict[str, str], deadline: float,
         cpu: Dict[str, float], who: str) -> Optional[str]:
    """Runs one trainer's process until `deadline` (`time.monotonic()`), its output to `log`,
    its CPU seconds into `cpu[who]`; why it failed, or None."""
    timeout = max(1.0, deadline - time.monotonic())
    before = _children_cpu_s()
    with open(log, "w") as out:
        try:
            code = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env,
                                  timeout=timeout, check=False).returncode
        except subprocess.TimeoutExpired:  # subprocess.run has killed it.
            return f"no end within the row's time ({timeout:.0f} s left when it started)"
        finally:
            cpu[who] = round(_children_cpu_s() - before, 1)
    return None if code == 0 else f"exit {code}: {_last_line(log)}"


# What a row's reason says when Model Garden's own run agrees with ctl where its in-run numbers
# do not (the page says so: bench/model_garden_zoo/page.py).
SAME_FROM_SCRATCH = "from empty model dirs they are the same"
SAME_AS_ITS_EVAL = "gives ctl's numbers"


def scratch_reason(diff: Optional[float]) -> str:
    """What the losses of both trainers from empty model dirs say of training losses that differ
    from the initial checkpoint ('' if a run failed).

    Args:
      diff: their max relative difference (None: a trainer's run failed).
    """
    if diff is None:
        return ""
    if diff > compare.LOSS_TOLERANCE:
        return f"from empty model dirs as well (max relative difference {diff:.2e})"
    return (f"{SAME_FROM_SCRATCH} (max relative difference {diff:.1e}): the "
            "initial checkpoint moves Model Garden's dropout draws, not ctl's (where its trainer "
            "builds the model in its first step, the restore gives the new variables their values "
            "and no initializer runs, whose seeds come from the seeded stream its dropout "
            "generators' seeds then come from; ctl builds the model, initializers and all, "
            "before it restores, as both do from scratch)")


def eval_mode_reason(step: int, differing: List[str], ops: Sequence[str]) -> str:
    """What Model Garden's own `--mode=eval` of its last checkpoint says of evaluations that
    differ after equal training losses.

    Args:
      step: the last checkpoint's step.
      differing: its metrics that differ from ctl's evaluation at `step` (`_differing`).
      ops: the stateful random ops ctl's log says its eval step draws from ([]: none named).
    """
    if differing:
        return (f"Model Garden's own --mode=eval of its ckpt-{step} differs from ctl's too: "
                + _first_three(differing))
    drawn = f" ({', '.join(ops)})" if ops else ""
    return (f"Model Garden's own --mode=eval of its ckpt-{step} {SAME_AS_ITS_EVAL}: the eval step "
            f"draws from stateful random ops{drawn}, whose state lives in their kernels; ctl "
            "traces it anew for each evaluation, so that every evaluation of a checkpoint draws "
            "what the seed gives, while Model Garden's trainer goes on with the kernels of its "
            "earlier evaluations")


def _eval_random_ops(log: str) -> List[str]:
    """The stateful random ops ctl's log says its eval step draws from (ctl.core.evaluation's
    line); [] if it names none."""
    with open(log) as f:
        for line in f:
            if RANDOM_OPS_LINE in line:
                return line.split(RANDOM_OPS_LINE, 1)[1].split(")", 1)[0].split(", ")
    return []


def _last_evaluation(model_dir: str) -> Tuple[Optional[int], Dict[str, float]]:
    """The step of the last evaluation in `model_dir`'s `validation/`, and its metrics."""
    evals = _evaluations(model_dir)
    steps = {step for values in evals.values() for step in values}
    if not steps:
        return None, {}
    step = max(steps)
    return step, {metric: values[step] for metric, values in evals.items()
                  if step in values and not metric.startswith("best_")}


def check_command(experiment: str, workdir: str, metrics: Sequence[str],
                  budget_s: float = BUDGET_S) -> Dict[str, Any]:
    """Runs `experiment`'s YAML through `python -m ctl.train` and Model Garden's trainer; its row's
    `command` fields.

    Args:
      experiment: a registered experiment's name.
      workdir: the zoo's workdir (its generated `data/`; this check's files in `runs/NAME/`).
      metrics: the metrics Model Garden's evaluation of the experiment reports (the zoo row's).
      budget_s: seconds for the whole check; a trainer still running when they are up is stopped.
    """
    deadline = time.monotonic() + budget_s
    row: Dict[str, Any] = {"experiment": experiment, "command": False, "command_reason": ""}
    name = experiment.replace("/", "_")
    root = os.path.join(workdir, "runs", name, "command")
    shutil.rmtree(root, ignore_errors=True)  # A fresh start (a row may be run again).
    os.makedirs(root)
    dirs = {"ctl": os.path.join(root, "ctl"), "train_lib": os.path.join(root, "train_lib")}
    data_dir = os.path.join(workdir, "data")
    stage = "writing the YAML and the initial checkpoint"
    try:
        # Its eval steps: -1, the whole set, unless the set never ends.
        eval_steps = write_initial_checkpoint(experiment, config(experiment, data_dir, metrics),
                                              list(dirs.values()))
        yaml_config = config(experiment, data_dir, metrics, eval_steps)
        path = write_yaml(os.path.join(root, f"{name}.yaml"), yaml_config)
    except Exception as error:  # The row says why, in a line a user can check.
        traceback.print_exc()
        said = (str(error).strip().splitlines()[0] if type(error).__name__ == "UserError"
                else compare._message(error))  # gin adds a line under a ctl UserError.
        row["command_reason"] = f"{stage}: {type(error).__name__}: {said[:300]}"
        return row
    trainer = yaml_config["trainer"]
    row["command_best"] = (f"{trainer['best_checkpoint_eval_metric']} "
                           f"({trainer['best_checkpoint_metric_comp']})"
                           if "best_checkpoint_eval_metric" in trainer else None)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_USE_LEGACY_KERAS", None)  # ctl.train sets it for a ranking experiment itself.
    failed = {}
    launched = {}
    cpu: Dict[str, float] = {}  # Each trainer's whole process: load moves it less than wall time.
    row["command_process_cpu_s"] = cpu
    user = [sys.executable, "-m", "ctl.train", f"--experiment={experiment}", "--mode=train_and_eval",
            f"--model_dir={dirs['ctl']}", f"--config_file={path}", SEED_BINDING]
    launched["ctl"] = time.time()
    failed["ctl"] = _run(user, os.path.join(root, "ctl.log"), env, deadline, cpu, "ctl")
    garden = [sys.executable, "-m", "bench.model_garden_zoo.command", "--train_lib", experiment,
              f"--config_file={path}", f"--model_dir={dirs['train_lib']}"]
    launched["train_lib"] = time.time()
    failed["train_lib"] = _run(garden, os.path.join(root, "train_lib.log"), dict(os.environ),
                               deadline, cpu, "train_lib")
    row["command_line"] = " ".join(["python"] + user[1:]).replace(root + os.sep, "")
    runs = "; ".join(f"{'ctl.train' if who == 'ctl' else 'train_lib'}: {why}"
                     for who, why in failed.items() if why)
    if runs:
        row["command_checks"] = {check: False for check in CHECKS}
        row["command_reason"] = runs
        return row
    # Launch to the first loop's end, each trainer in its own process: import, config, model,
    # restore, input, tracing, checks and the loop's steps.
    row["command_first_loop_s"] = {
        who: first_loop_s(dirs[who], launched[who], schedule(trainer)["loops"][0]) for who in dirs}
    found = checks(dirs, trainer)
    reasons = {"runs": "", **found.pop("command_reasons")}
    if reasons.get("loss", "").startswith("training losses differ"):
        # Both again from empty model dirs: does the initial checkpoint make the difference?
        empty = {who: os.path.join(root, "empty", who) for who in dirs}
        for directory in empty.values():
            os.makedirs(directory)  # Some tasks write files there as they are built (WMT's).
        ran = [_run(user[:-3] + [f"--model_dir={empty['ctl']}"] + user[-2:],
                    os.path.join(root, "empty", "ctl.log"), env, deadline, {}, "ctl"),
               _run(garden[:-1] + [f"--model_dir={empty['train_lib']}"],
                    os.path.join(root, "empty", "train_lib.log"), dict(os.environ), deadline, {},
                    "train_lib")]
        diff = None
        if not any(ran):
            losses = {"ctl": compare._train_losses(empty["ctl"], ["loss"]),
                      "train_lib": compare._train_losses(empty["train_lib"], ["training_loss", "loss"])}
            steps = schedule(trainer)["loops"]
            if all(sorted(values) == steps for values in losses.values()):
                diff = max(compare._relative(losses["ctl"][s], losses["train_lib"][s]) for s in steps)
        row["command_empty_dirs_max_rel_loss_diff"] = diff
        reasons["loss"] = "; ".join(filter(None, [reasons["loss"], scratch_reason(diff)]))
    elif reasons.get("eval", "").startswith("validation/ differs"):
        # Model Garden's own evaluation of its last checkpoint, in a process of its own.
        step, ours = _last_evaluation(dirs["ctl"])
        again = os.path.join(root, "train_lib_eval")
        shutil.copytree(dirs["train_lib"], again, ignore=shutil.ignore_patterns(
            "validation", "train", BEST_SUBDIR, "events.out.*"))
        if step is not None and not _run(
                garden[:-1] + [f"--model_dir={again}", "--mode=eval"],
                os.path.join(root, "train_lib_eval.log"), dict(os.environ), deadline, {},
                "train_lib"):
            theirs_step, theirs = _last_evaluation(again)
            if theirs_step == step:
                reasons["eval"] += "; " + eval_mode_reason(
                    step, _differing(ours, theirs, compare.EVAL_TOLERANCE),
                    _eval_random_ops(os.path.join(root, "ctl.log")))
    row.update(found)
    row["command_checks"] = {check: not reasons.get(check) for check in CHECKS}
    row["command"] = all(row["command_checks"].values())
    row["command_reason"] = "; ".join(reasons[check] for check in CHECKS if reasons.get(check))
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("experiment")
    parser.add_argument("--workdir", help="the zoo's workdir (its data/; runs/NAME/command/)")
    parser.add_argument("--metrics", default="",
                        help="the eval metrics Model Garden reports, comma-separated (the zoo row's)")
    parser.add_argument("--budget_s", type=float, default=BUDGET_S,
                        help="seconds for the whole check (its trainers are stopped then)")
    parser.add_argument("--train_lib", action="store_true",
                        help="be Model Garden's trainer on --config_file, in --model_dir")
    parser.add_argument("--config_file", help="with --train_lib")
    parser.add_argument("--model_dir", help="with --train_lib")
    parser.add_argument("--mode", default="train_and_eval", choices=["train_and_eval", "eval"],
                        help="with --train_lib")
    args = parser.parse_args(argv)
    from bench.model_garden_zoo import registry

    if args.train_lib:  # Timed (`first_loop_s`) with the imports Model Garden's own train.py pays.
        registry.import_as_train_py(args.experiment)
        run_train_lib(args.experiment, args.config_file, args.model_dir, args.mode)
        return 0
    registry.import_all()
    if not args.workdir:
        print("--workdir: give the zoo's workdir (its data/ holds the generated files)", file=sys.stderr)
        return 2
    row = check_command(args.experiment, args.workdir, [m for m in args.metrics.split(",") if m],
                        args.budget_s)
    usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    row["command_cpu_s"] = round(sum(u.ru_utime + u.ru_stime for u in usage), 1)
    print("ZOO-COMMAND " + json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
