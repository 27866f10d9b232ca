"""The sweep file: TOML (read with the standard library), checked whole before any trial starts.

    objective = "accuracy"        # an eval metric of the trials ("set/name" for a named eval set)
    direction = "maximize"        # or "minimize"
    trials = 12                   # the budget: trials that end completed, pruned or failed
    timeout = 900                 # optional: no trial starts once the study is this many seconds old
    sampler = "tpe"               # tpe (default), random, grid
    seed = 0                      # the sampler's seed: repeatable suggestions
    value = "best"                # a trial's value: its best evaluation (default), or "last"
    pruner = "asha"               # asha (default), median, none; or a table, e.g.
                                  # pruner = { name = "median", startup_trials = 2, warmup_steps = 0 }
    [space]                       # keys are gin bindings, as on --gin_bindings
    "DigitsTask.learning_rate" = { log_uniform = [1e-4, 1e-1] }
    "DigitsTask.hidden_units" = { choice = [32, 64, 128] }
    "TRAIN_STEPS" = { int_uniform = [500, 2000] }

`load` reads the text (a typo in a key, a bad distribution, a bad sampler or
pruner: `UserError`); `check_against_config` parses the gin files with a value
of each binding, as `ctl.run` would, so that an unknown configurable, parameter
or macro is found before a trial runs, and checks the objective against the
task's eval metrics when the task's own code cannot add others.
"""

import dataclasses
import difflib
import json
import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

import tomllib

from ctl.utils.errors import UserError

SAMPLERS = ("tpe", "random", "grid")
PRUNERS = ("asha", "median", "none")
DIRECTIONS = ("maximize", "minimize")
VALUES = ("best", "last")  # A trial's value: its best evaluation by the objective, or its last.
KEYS = ("objective", "direction", "value", "trials", "timeout", "sampler", "seed", "pruner", "study",
        "space")
# A distribution: its kind and the Optuna suggestion it is.
DISTRIBUTIONS = ("log_uniform", "uniform", "int_uniform", "int_log_uniform", "choice")
PRUNER_OPTIONS = {
    "asha": ("name", "min_resource", "reduction_factor"),
    "median": ("name", "startup_trials", "warmup_steps"),
    "none": ("name",),
}


@dataclasses.dataclass(frozen=True)
class Parameter:
    """One binding of the space: `kind` is one of DISTRIBUTIONS; `values` its bounds or choices.

    Args:
        binding: the gin binding, e.g. `DigitsTask.learning_rate`.
        kind: one of `DISTRIBUTIONS`.
        values: its bounds (a range) or its choices.
    """

    binding: str
    kind: str
    values: Tuple[Any, ...]

    def gin_value(self, value: Any) -> str:
        """`value` as gin text: numbers and booleans as Python writes them, strings quoted
        unless they are a gin reference (`@name`, `%MACRO`).

        Args:
            value: a value of the space.
        """
        if isinstance(value, str):
            return value if value[:1] in "@%" else json.dumps(value)
        return repr(value)

    def binding_text(self, value: Any) -> str:
        """The gin binding line for `value`.

        Args:
            value: a value of the space.
        """
        return f"{self.binding} = {self.gin_value(value)}"

    def example(self) -> Any:
        """A value of the space (to check the binding against the gin config)."""
        return self.values[0]


@dataclasses.dataclass(frozen=True)
class SweepFile:
    """A parsed and checked sweep file.

    Args:
        path: the file.
        objective: the eval metric the sweep optimizes.
        direction: `maximize` or `minimize`.
        trials: the budget: how many trials.
        sampler: the Optuna sampler's name.
        seed: the sampler's seed (None: unseeded).
        pruner: the `[pruner]` table.
        study: the study's name.
        space: the bindings the sweep samples.
        timeout: seconds from the study's creation after which no trial starts (None: no limit).
        value: a trial's value, one of `VALUES`: its best evaluation by the objective (`best`), or
            its last (`last`).
    """
    path: str
    objective: str
    direction: str
    trials: int
    sampler: str
    seed: Optional[int]
    pruner: Dict[str, Any]
    study: str
    space: Tuple[Parameter, ...]
    timeout: Optional[float] = None  # Seconds from the study's creation after which no trial starts.
    value: str = "best"  # One of VALUES.

    @property
    def maximize(self) -> bool:
        return self.direction == "maximize"

    def bindings(self, params: Dict[str, Any]) -> List[str]:
        """The gin bindings of a trial's sampled `params` (keyed by binding), in the file's order.

        Args:
            params: the trial's sampled values, keyed by binding.
        """
        return [p.binding_text(params[p.binding]) for p in self.space if p.binding in params]

    def grid(self) -> Dict[str, List[Any]]:
        return {p.binding: list(p.values) for p in self.space}


# What a study keeps of the sweep file that made it: all but what may change on an existing study.
MAY_CHANGE = ("trials", "timeout")


def identity(sweep: SweepFile) -> Dict[str, Any]:
    """What the study keeps of `sweep` (a study user attribute, JSON): everything but `trials`
    and `timeout`, which may change on an existing study.

    Args:
        sweep: the parsed sweep file.
    """
    return {"objective": sweep.objective, "direction": sweep.direction, "value": sweep.value,
            "sampler": sweep.sampler, "seed": sweep.seed, "pruner": dict(sweep.pruner),
            "space": [[p.binding, p.kind, list(p.values)] for p in sweep.space]}


def check_same_study(kept: Dict[str, Any], sweep: SweepFile, study: str) -> None:
    """Raises `UserError` (one line) naming the first key of `sweep` that differs from what the
    study `study` kept when it was created (`identity`).

    Args:
        kept: what the study keeps of the sweep file that created it.
        sweep: the parsed sweep file.
        study: the study's name.
    """
    now = json.loads(json.dumps(identity(sweep)))
    kept = json.loads(json.dumps(kept))
    for key, value in now.items():
        if key in kept and kept[key] != value:
            what = _space_change(kept[key], value) if key == "space" else (
                f"{key} = {_toml(value)}, but the study was created with {key} = {_toml(kept[key])}")
            raise _fail(sweep.path, f"{what}; the study {study!r} in this storage holds trials of "
                        "that, and only trials and timeout may change on it: put the file back, or "
                        'name a new study (study = "...") or a new --sweep_dir.')


def _space_change(kept: List[Any], now: List[Any]) -> str:
    before = {binding: (kind, values) for binding, kind, values in kept}
    after = {binding: (kind, values) for binding, kind, values in now}
    for binding, (kind, values) in after.items():
        if binding not in before:
            return f"[space] {binding!r} is new (the study was created without it)"
        if before[binding] != (kind, values):
            old_kind, old_values = before[binding]
            return (f"[space] {binding!r} = {{ {kind} = {_toml(values)} }}, but the study was "
                    f"created with {{ {old_kind} = {_toml(old_values)} }}")
    gone = [binding for binding in before if binding not in after]
    if gone:
        return f"[space] has no {gone[0]!r} (the study was created with it)"
    return f"[space] lists its bindings in another order ({', '.join(after)})"


def _toml(value: Any) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if value is None:
        return "(none)"
    return json.dumps(value)


def _fail(path: str, message: str) -> UserError:
    return UserError(f"--sweep_file={path}: {message}")


def _unknown_key(path: str, key: str, known: Sequence[str], where: str) -> UserError:
    near = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    hint = f"did you mean {near[0]!r}?" if near else f"the keys are: {', '.join(known)}."
    return _fail(path, f"unknown key {key!r}{where}; {hint}")


def load(path: str) -> SweepFile:
    """Reads and checks the sweep file at `path`; raises `UserError` (one line) on any mistake.

    Args:
        path: the sweep file (TOML).
    """
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as error:
        raise UserError(f"cannot read --sweep_file={path} ({error.strerror}); name an existing "
                        "TOML file.") from error
    except tomllib.TOMLDecodeError as error:
        raise _fail(path, f"not valid TOML ({error}); see docs/how-to/tune-hyperparameters.md.")
    for key in data:
        if key not in KEYS:
            raise _unknown_key(path, key, KEYS, "")
    objective = data.get("objective")
    if not isinstance(objective, str) or not objective:
        raise _fail(path, 'needs objective = "METRIC", an eval metric of the trials (e.g. '
                    '"accuracy").')
    direction = _choice(path, data, "direction", DIRECTIONS, "maximize")
    value = _choice(path, data, "value", VALUES, "best")
    trials = data.get("trials")
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
        raise _fail(path, f"trials = {trials!r}: the budget must be a positive integer (e.g. "
                    "trials = 12).")
    timeout = data.get("timeout")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or not 0 < timeout < math.inf):
        raise _fail(path, f"timeout = {timeout!r}: the wall budget is a positive number of seconds "
                    "(e.g. timeout = 900), or no timeout key.")
    sampler = _choice(path, data, "sampler", SAMPLERS, "tpe")
    seed = data.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise _fail(path, f"seed = {seed!r}: a seed is an integer (e.g. seed = 0).")
    pruner = _pruner(path, data.get("pruner", "asha"))
    study = data.get("study", _stem(path))
    if not isinstance(study, str) or not study:
        raise _fail(path, f"study = {study!r}: the study's name is a non-empty string.")
    space = data.get("space")
    if not isinstance(space, dict) or not space:
        raise _fail(path, 'needs a [space] table of gin bindings, e.g. '
                    '"DigitsTask.learning_rate" = { log_uniform = [1e-4, 1e-1] }.')
    parameters = tuple(_parameter(path, binding, spec) for binding, spec in space.items())
    if sampler == "grid":
        kinds = [p.binding for p in parameters if p.kind != "choice"]
        if kinds:
            raise _fail(path, f'sampler = "grid" takes choices only, but {kinds[0]!r} is not '
                        '{ choice = [...] }; list its values, or use sampler = "tpe".')
        size = math.prod(len(p.values) for p in parameters)
        if trials > size:
            raise _fail(path, f"trials = {trials} is more than the grid's {size} points; set "
                        f"trials = {size} or fewer.")
    return SweepFile(path, objective, direction, trials, sampler, seed, pruner, study, parameters,
                     None if timeout is None else float(timeout), value)


def _stem(path: str) -> str:
    import os

    return os.path.splitext(os.path.basename(path))[0]


def _choice(path: str, data: Dict[str, Any], key: str, choices: Sequence[str], default: str) -> str:
    value = data.get(key, default)
    if value not in choices:
        raise _fail(path, f"{key} = {value!r}; expected one of: {', '.join(choices)}.")
    return value


def _pruner(path: str, value: Any) -> Dict[str, Any]:
    options = {"name": value} if isinstance(value, str) else value
    if not isinstance(options, dict) or options.get("name") not in PRUNERS:
        name = options.get("name") if isinstance(options, dict) else options
        raise _fail(path, f"pruner = {name!r}; expected one of: {', '.join(PRUNERS)} (or a table "
                    'with name = "...").')
    known = PRUNER_OPTIONS[options["name"]]
    for key, option in options.items():
        if key not in known:
            raise _unknown_key(path, key, known, f" in pruner {options['name']!r}")
        if key != "name" and (isinstance(option, bool) or not isinstance(option, int)
                              or option < 0):
            raise _fail(path, f"pruner's {key} = {option!r}; expected a non-negative integer.")
    return dict(options)


def _parameter(path: str, binding: str, spec: Any) -> Parameter:
    where = f"[space] {binding!r}"
    if "=" in binding or not binding.replace(".", "").replace("/", "").replace("_", "").isalnum():
        raise _fail(path, f"{where} is not a gin binding's name (e.g. \"DigitsTask.learning_rate\" "
                    "or \"TRAIN_STEPS\").")
    if not isinstance(spec, dict) or len(spec) != 1:
        raise _fail(path, f"{where} = {spec!r}; expected one distribution, e.g. "
                    "{ log_uniform = [1e-4, 1e-1] } or { choice = [32, 64] }.")
    (kind, values), = spec.items()
    if kind not in DISTRIBUTIONS:
        near = difflib.get_close_matches(kind, DISTRIBUTIONS, n=1, cutoff=0.6)
        hint = f"did you mean {near[0]!r}?" if near else f"expected one of: {', '.join(DISTRIBUTIONS)}."
        raise _fail(path, f"{where} has an unknown distribution {kind!r}; {hint}")
    if not isinstance(values, list) or not values:
        raise _fail(path, f"{where}: {kind} takes a list, e.g. {kind} = "
                    f"{'[32, 64]' if kind == 'choice' else '[LOW, HIGH]'}.")
    if kind == "choice":
        for value in values:
            if not isinstance(value, (bool, int, float, str)):
                raise _fail(path, f"{where}: choice {value!r} is not a number, boolean or string.")
        if len(set(map(repr, values))) < len(values):
            raise _fail(path, f"{where}: choice lists a value twice.")
        return Parameter(binding, kind, tuple(values))
    integer = kind.startswith("int_")
    numbers = (int,) if integer else (int, float)
    if (len(values) != 2 or any(isinstance(v, bool) or not isinstance(v, numbers) for v in values)):
        raise _fail(path, f"{where}: {kind} takes [LOW, HIGH], two {'integers' if integer else 'numbers'}; "
                    f"got {values!r}.")
    low, high = values
    if not low < high:
        raise _fail(path, f"{where}: {kind} = [{low}, {high}] needs LOW < HIGH.")
    if kind.endswith("log_uniform") and low <= 0:
        raise _fail(path, f"{where}: {kind} needs LOW > 0 (got {low}); use uniform for a range "
                    "that includes 0.")
    return Parameter(binding, kind, (low if integer else float(low), high if integer else float(high)))


def check_against_config(sweep: SweepFile, gin_files: Sequence[str], gin_bindings: Sequence[str],
                         search_paths: Sequence[str]) -> None:
    """Parses the gin config with a value of every binding of the space (as a trial's `ctl.run`
    will), then checks the objective; raises `UserError` naming the sweep file's mistake.

    Imports TensorFlow and the gin files' modules (what a trial imports).

    Args:
        sweep: the parsed sweep file.
        gin_files: the sweep command's `--gin_file`s, passed on to every trial.
        gin_bindings: its `--gin_bindings`, before the trial's own.
        search_paths: its `--gin_search_paths`.
    """
    import gin

    import ctl
    from ctl.config import gin_config as config

    ctl.import_api()
    sampled = [p.binding_text(p.example()) for p in sweep.space]
    try:
        config.parse(gin_files, list(gin_bindings) + sampled, search_paths)
    except UserError as error:
        culprit = next((p.binding for p in sweep.space if p.binding.split(".")[-1] in str(error)
                        or p.binding.rsplit(".", 1)[0] in str(error)), None)
        if culprit is None:
            raise
        message = str(error).replace("Fix the binding in --gin_file or --gin_bindings.",
                                     "Fix the key in the sweep file's [space].")
        raise UserError(f"--sweep_file={sweep.path}: [space] {culprit!r}: {message}") from None
    try:
        _check_objective(sweep)
        _check_best_checkpoint(sweep)
    finally:
        gin.clear_config()


def _check_best_checkpoint(sweep: SweepFile) -> None:
    """With `value = "best"` each trial keeps its best checkpoint by the objective in `best/`:
    raises `UserError` if the experiment's hooks keep one there by another metric."""
    from ctl.experiment import Experiment
    from ctl.hooks import BestCheckpoint

    if sweep.value != "best":
        return
    try:
        hooks = Experiment().hooks
    except Exception:  # noqa: BLE001 - an experiment that cannot be built here: its trial will say why.
        return
    for hook in hooks:
        if isinstance(hook, BestCheckpoint) and hook != BestCheckpoint(sweep.objective,
                                                                       sweep.maximize):
            raise _fail(sweep.path, f'value = "best" keeps each trial\'s best checkpoint by '
                        f"{sweep.objective!r} ({sweep.direction}) in best/, where the experiment's "
                        f"ctl.hooks.BestCheckpoint keeps one by {hook.metric!r} "
                        f"(higher_is_better={hook.higher_is_better}); set value = \"last\", or "
                        "bind its metric to the objective.")


def _check_objective(sweep: SweepFile) -> None:
    """Raises `UserError` if the task's eval logs cannot hold the objective.

    Checkable when the task reports only its loss and its `build_metrics(training=False)`
    (it does not override `validation_step` or the log aggregation, which may add others).
    """
    from ctl.core.task import Task
    from ctl.experiment import Experiment

    try:
        task = Experiment().task
    except Exception:  # A task that cannot be built here: its trial will say why.
        return
    for method in ("validation_step", "aggregate_logs", "reduce_aggregated_logs"):
        if getattr(type(task), method) is not getattr(Task, method):
            return
    metrics = ["loss"] + [m.name for m in task.build_metrics(training=False)]
    sets = list(task.eval_datasets() or ())
    names = [f"{eval_set}/{name}" for eval_set in sets for name in metrics] if sets else metrics
    if sweep.objective not in names:
        near = difflib.get_close_matches(sweep.objective, names, n=1, cutoff=0.6)
        hint = f"did you mean {near[0]!r}?" if near else f"the eval metrics: {', '.join(names)}."
        raise _fail(sweep.path, f"objective = {sweep.objective!r} is not an eval metric of "
                    f"{type(task).__name__}; {hint}")
