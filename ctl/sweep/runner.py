"""A trial: one `python -m ctl.sweep.trial` process (a ctl run) in the trial's model dir.

The child is `ctl.run --mode=train_and_eval` with the pruning hook appended to
its experiment's hooks (`ctl.sweep.trial`, `ctl.sweep.pruning`): the run itself
reports the objective to Optuna at each evaluation, asks the pruner, and when
pruned writes `sweep_pruned.json` and stops at that evaluation with a
checkpoint. Its sampled bindings follow the sweep command's `--gin_bindings`
on its command line, so its `config.gin` holds them, and running the same
command again resumes it from its own checkpoint (every guarantee of a run
holds). While it runs, the worker renews the trial's heartbeat and passes its
own SIGTERM on. The child's output goes to `<sweep_dir>/trials/<number>/sweep_trial.log`
(its model dir, unless `--trials_dir` put that elsewhere). Everything read from
the model dir (the evaluations, `sweep_pruned.json`) is read through
`ctl.model_dir` (`tf.io.gfile`): it may be on a bucket.

How it ends, from the child's exit status and its model dir:
  0 or 75, with sweep_pruned.json  pruned: the value it was pruned on
  0                                complete: the objective of its best evaluation (the sweep
                                   file's `value = "best"`, whose checkpoint the run keeps in
                                   `best/`) or of its last one (`value = "last"`), from
                                   `metrics.jsonl` (`ctl.hooks.progress`'s records)
  not 0 after the worker's SIGTERM interrupted: the trial stays RUNNING, to resume
  75 otherwise                     preempted on its own: run again (it resumes)
  anything else                    failed, with the child's one line (`ctl.run: error: ...`)

On Linux the child is killed with its worker (`PR_SET_PDEATHSIG`): a worker
killed with -9 leaves no trial training unseen. There, the worker's
`ctl.sweep.launcher` forks the child from a process that has imported
TensorFlow and ctl already (`--fork_trials`).
"""

import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Dict, List, NamedTuple, Optional, Sequence

import optuna

from ctl.sweep import pruning
from ctl.sweep.launcher import Launcher
from ctl.sweep.study import Study, make_sampler
from ctl.sweep.sweep_dir import trial_log_file
from ctl.sweep.sweep_file import SweepFile

if TYPE_CHECKING:
    from ctl.model_dir import ModelDir

EXIT_PREEMPTED = 75  # ctl.core.stop.EXIT_PREEMPTED, without importing TensorFlow's side.
POLL_S = 0.1  # How soon the worker's SIGTERM reaches the trial.


class Outcome(NamedTuple):
    """How a trial ended, as its worker records it in the study.

    Args:
        state: complete, pruned, failed, interrupted, or again (run it again).
        value: the objective's last value (None: none).
        message: the trial's one line (why it failed).
    """
    state: str  # complete, pruned, failed, interrupted, again
    value: Optional[float] = None
    message: str = ""


def suggest(trial: optuna.Trial, sweep: SweepFile) -> Dict[str, Any]:
    """The trial's values of the space: sampled now, or those it already has (a resumed trial).

    Args:
        trial: the Optuna trial.
        sweep: the parsed sweep file.
    """
    params = {}
    for p in sweep.space:
        low, high = p.values[0], p.values[-1]
        if p.kind == "choice":
            params[p.binding] = trial.suggest_categorical(p.binding, list(p.values))
        elif p.kind.startswith("int_"):
            params[p.binding] = trial.suggest_int(p.binding, low, high, log=p.kind.endswith("log_uniform"))
        else:
            params[p.binding] = trial.suggest_float(p.binding, low, high, log=p.kind == "log_uniform")
    return params


def command(model_dir: "ModelDir", gin_files: Sequence[str], gin_bindings: Sequence[str],
            search_paths: Sequence[str], trial: Sequence[str]) -> List[str]:
    """The child's command line; `trial` are its `ctl.sweep.trial` flags (`trial_flags`).

    Args:
        model_dir: the trial's model dir.
        gin_files: the sweep command's `--gin_file`s, passed on to every trial.
        gin_bindings: the gin bindings, the trial's sampled ones last.
        search_paths: its `--gin_search_paths`.
        trial: the `ctl.sweep.trial` flags (`trial_flags`).
    """
    argv = [sys.executable, "-m", "ctl.sweep.trial", *trial, "--mode=train_and_eval",
            f"--model_dir={model_dir.path}"]
    argv += [f"--gin_file={path}" for path in gin_files]
    argv += [f"--gin_bindings={binding}" for binding in gin_bindings]
    if search_paths:
        argv.append(f"--gin_search_paths={','.join(search_paths)}")
    return argv


def trial_flags(sweep: SweepFile, sweep_dir: str, storage: Optional[str], number: int) -> List[str]:
    """How the child finds its trial in the study: the sweep file, the sweep dir, the storage.

    Args:
        sweep: the parsed sweep file.
        sweep_dir: the sweep dir (local: the study's journal, the record, the workers' slots, the trial logs).
        storage: the sweep's `--storage` (None: the journal file in the sweep dir).
        number: the trial's number.
    """
    flags = [f"--sweep_file={os.path.abspath(sweep.path)}", f"--sweep_dir={sweep_dir}",
             f"--trial={number}"]
    return flags + ([f"--storage={storage}"] if storage else [])


def objective_value(record: Dict[str, Any], objective: str) -> Optional[float]:
    """The objective in one evaluation record, or None if it is not a number there.

    Args:
        record: one `eval` line of `metrics.jsonl`.
        objective: the objective's name.
    """
    value = record.get(objective)
    return float(value) if isinstance(value, (int, float)) else None


def last_line(log_path: str) -> str:
    """The child's one line: its `ctl.run: ...` line, else its traceback's exception line, else
    the last line it wrote.

    Args:
        log_path: the trial's log file.
    """
    try:
        with open(log_path, errors="replace") as f:
            lines = [line.strip() for line in f.read().splitlines() if line.strip()]
    except OSError:
        return "no output"
    ours = [line for line in lines if line.startswith("ctl.run:")]
    raised = [line for line in lines if re.match(r"^[\w.]*(Error|Exception|Interrupt)\b.*:", line)]
    return (ours or raised or lines or ["no output"])[-1][:400]


def run(study: Study, number: int, sweep: SweepFile, model_dir: "ModelDir", gin_files: Sequence[str],
        gin_bindings: Sequence[str], search_paths: Sequence[str], stop: threading.Event,
        heartbeat_s: float, say=print, *, sweep_dir: str, storage: Optional[str],
        launcher: Optional[Launcher] = None) -> Outcome:
    """Runs trial `number` to its end (or until `stop` is set: it is then interrupted).

    Args:
        study: the sweep's study.
        number: the trial's number.
        sweep: the parsed sweep file.
        model_dir: the trial's model dir.
        gin_files: the sweep command's `--gin_file`s, passed on to every trial.
        gin_bindings: its `--gin_bindings`, before the trial's own.
        search_paths: its `--gin_search_paths`.
        stop: set to interrupt the trial (a signal to the worker).
        heartbeat_s: seconds between the trial's heartbeats in the study.
        say: prints one of the worker's lines.
        sweep_dir: the sweep dir (local: the study's journal, the record, the workers' slots, the trial logs).
        storage: the sweep's `--storage` (None: the journal file in the sweep dir).
        launcher: the worker's warm launcher (None: a new process).
    """
    study.optuna.sampler = make_sampler(sweep, number)
    params = suggest(study.optuna_trial(number), sweep)
    bindings = sweep.bindings(params)
    log_path = trial_log_file(sweep_dir, number)
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    if stop.is_set():
        return Outcome("interrupted")
    say(f"trial {number}: starting in {model_dir}: {', '.join(bindings)}")
    child = (launcher or Launcher(fork=False)).start(  # ctl.sweep.launcher: forked, or a new process.
        command(model_dir, gin_files, list(gin_bindings) + bindings, search_paths,
                trial_flags(sweep, sweep_dir, storage, number)), log_path)
    stopped, last_beat = False, time.monotonic()
    while True:
        try:
            status = child.wait(timeout=POLL_S)
            break
        except subprocess.TimeoutExpired:
            pass
        if stop.is_set() and not stopped:
            child.send_signal(signal.SIGTERM)
            stopped = True
        if time.monotonic() - last_beat >= heartbeat_s:
            study.beat(number)
            last_beat = time.monotonic()
    pruned = pruning.read_pruned(model_dir)
    if isinstance(pruned, dict) and status in (0, EXIT_PREEMPTED):
        return Outcome("pruned", pruned.get("value"), f"pruned at step {pruned.get('step')}")
    if stopped and status != 0:
        # Whatever its status: a trial stopped before its run watched signals (-15), or that
        # failed while it stopped, stays RUNNING, and the same command resumes it.
        return Outcome("interrupted")
    if status == EXIT_PREEMPTED:
        return Outcome("again", message=last_line(log_path))
    if status != 0:
        return Outcome("failed", message=f"exit status {status}: {last_line(log_path)}")
    values = [objective_value(r, sweep.objective) for r in model_dir.metrics("eval")]
    values = [v for v in values if v is not None]
    if not values:
        return Outcome("failed", message=f"no evaluation recorded objective {sweep.objective!r} "
                       f"in {model_dir.metrics_file}")
    if math.isnan(values[-1]):
        return Outcome("failed", message=f"{sweep.objective} is NaN at the last evaluation")
    return Outcome("complete", trial_value(values, sweep))


def trial_value(values: Sequence[float], sweep: SweepFile) -> float:
    """A completed trial's value from its evaluations' objective, oldest first: the last one
    (`value = "last"`), or the best one by the sweep's direction (`value = "best"`; NaN never
    is).

    Args:
        values: the objective at each evaluation, oldest first.
        sweep: the parsed sweep file (its `value`: best or last).
    """
    if sweep.value == "last":
        return values[-1]
    finite = [v for v in values if not math.isnan(v)]
    return (max if sweep.maximize else min)(finite)
