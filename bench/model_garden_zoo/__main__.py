"""`python -m bench.model_garden_zoo`: every registered Model Garden experiment, on ctl and on train_lib.

    python -m bench.model_garden_zoo [--experiments=NAME,NAME] [--steps=K] [--results=FILE]
                                     [--jobs=N] [--longest_first] [--export] [--command]
                                     [--guarantees[=only]] [--timeout_s=S]

Lists Model Garden's registry at run time, and for each experiment (or those
named) trains its tiny variant K steps with ctl and with Model Garden's
`train_lib` from one initial checkpoint (bench/model_garden_zoo/compare.py),
each experiment in a process of its own. Prints one JSON line per experiment:
`{"experiment", "trains", "same_loss", "max_rel_loss_diff", "same_eval",
"ctl_s_per_step", "train_lib_s_per_step", "ctl_first_step_s", "train_lib_first_step_s", "reason"}`
(the first-step fields: seconds from each trainer's call to its first completed step), and writes all rows,
with the details (losses, eval metrics, weights), the commit and the host's
load, to the results file that `python -m bench.model_garden_zoo.page` turns
into the docs page. `--guarantees` adds ctl's four guarantees to each row
(kill -9, SIGTERM, the sidecar, a new replica count:
bench/model_garden_zoo/guarantees.py); `--guarantees=only` runs those alone and
keeps the rest of each row as the results file has it.

With `--export`, each experiment instead gets the export check of
bench/model_garden_zoo/export.py (a ctl run of K steps with
`ctl.hooks.FinalExporter`, its SavedModel loaded and compared with the model
restored from the run's final checkpoint), and its `export` fields are written
into the row the results file already has.

With `--command`, each experiment instead runs as a user runs it (bench/model_garden_zoo/command.py):
its tiny variant as a YAML file with trainer settings of its own, through `python -m ctl.train`
and through Model Garden's trainer, each in its own process from one initial checkpoint; its
`command` fields (the same losses and evaluations, checkpoints, evaluations and the best
checkpoint at the YAML's steps; `--steps` is not used) are written into the row the results file
already has.
"""

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Dict, List

from bench.model_garden_zoo import guarantees

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(ROOT, "bench", "results", "model_garden_zoo.json")  # The docs keep theirs.
KEYS = ["experiment", "trains", "same_loss", "max_rel_loss_diff", "same_eval", "ctl_s_per_step",
        "train_lib_s_per_step", "ctl_first_step_s", "train_lib_first_step_s", "reason"]
TIMEOUT_S = 2400  # One experiment, both trainers; a row that takes longer says so.
RUN_FILE, LOADS_FILE = "zoo_run.json", "zoo_loads.txt"  # In the workdir: what --collect reads.


def _registered() -> Dict[str, str]:
    """experiment -> family, listed in a child process (the parent imports no TensorFlow)."""
    code = ("import json; from bench.model_garden_zoo import registry; failed = registry.import_all(); "
            "print('ZOO-LIST ' + json.dumps({'families': {n: registry.family(n) "
            "for n in registry.experiments()}, 'failed': failed}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env=_env(legacy_keras=False), check=False)
    for line in out.stdout.splitlines():
        if line.startswith("ZOO-LIST "):
            return json.loads(line[len("ZOO-LIST "):])
    raise SystemExit(f"listing Model Garden's registry failed: {out.stderr.strip().splitlines()[-1:]}")


def _env(legacy_keras: bool) -> Dict[str, str]:
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    if legacy_keras:  # tensorflow_recommenders (the ranking task) refuses Keras 3 as tf.keras.
        env["TF_USE_LEGACY_KERAS"] = "1"
    return env


# TensorFlow's op determinism rewrites a parallel map with random ops
# (`make_deterministic_parallel_map_and_batch`) into a graph that some of Model
# Garden's detection parsers cannot run; such a row is run again without it.
DETERMINISM_REWRITE = "make_deterministic"
DETERMINISM_NOTE = ("op determinism off: TensorFlow's make_deterministic_parallel_map_and_batch "
                    "rewrite of the input pipeline fails to run (InvalidArgumentError in MakeIterator)")


def run_row(experiment: str, family: str, steps: int, workdir: str, log_dir: str) -> Dict[str, Any]:
    """One experiment's row (see `_run_row`); without op determinism where TensorFlow's rewrite fails."""
    row = _run_row(experiment, family, steps, workdir, log_dir, determinism=True)
    log = os.path.join(log_dir, experiment.replace("/", "_") + ".log")
    with open(log) as f:
        rewrite_failed = not (row["same_loss"] and row["same_eval"]) and DETERMINISM_REWRITE in f.read()
    if rewrite_failed:
        row = _run_row(experiment, family, steps, workdir, log_dir, determinism=False)
        row["determinism_note"] = DETERMINISM_NOTE
    return row


def _run_logged(command: List[str], log: str, family: str) -> List[str]:
    """Runs a row's check in its own process, its output to `log` (a hang ends at TIMEOUT_S); the
    log's lines."""
    with open(log, "w") as out:
        try:
            subprocess.run(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, timeout=TIMEOUT_S,
                           env=_env(legacy_keras=family == "ranking"), check=False)
        except subprocess.TimeoutExpired:
            pass
    with open(log) as f:
        return f.read().splitlines()


def _run_row(experiment: str, family: str, steps: int, workdir: str, log_dir: str,
             determinism: bool) -> Dict[str, Any]:
    """One experiment's row, from its own process (a crash or a hang is its row's reason)."""
    log = os.path.join(log_dir, experiment.replace("/", "_") + ("" if determinism else "-nodet") + ".log")
    command = [sys.executable, "-m", "bench.model_garden_zoo.compare", experiment,
               f"--steps={steps}", f"--workdir={workdir}"] + ([] if determinism else ["--no_determinism"])
    start = time.perf_counter()
    commit = _commit()
    lines = _run_logged(command, log, family)
    row = None
    for line in lines:
        if line.startswith("ZOO-ROW "):
            row = json.loads(line[len("ZOO-ROW "):])
    if row is None:
        elapsed = time.perf_counter() - start
        last = [line for line in lines if line.strip()][-1:] or ["no output"]
        reason = (f"no result within {TIMEOUT_S} s" if elapsed >= TIMEOUT_S
                  else f"the process ended without a result: {last[0][:300]}")
        row = {key: None for key in KEYS}
        row.update(experiment=experiment, trains=False, same_loss=False, same_eval=False, reason=reason)
    row["family"] = family
    row["commit"] = commit
    row["wall_s"] = round(time.perf_counter() - start, 1)
    return row


EXPORT_KEYS = ["export", "export_module", "export_signature", "export_reason"]


def run_export_row(experiment: str, family: str, steps: int, workdir: str, log_dir: str) -> Dict[str, Any]:
    """One experiment's export check (bench/model_garden_zoo/export.py), from its own process."""
    log = os.path.join(log_dir, experiment.replace("/", "_") + "-export.log")
    command = [sys.executable, "-m", "bench.model_garden_zoo.export", experiment, f"--steps={steps}",
               f"--workdir={workdir}"]
    return _side_check_row(command, log, family, "ZOO-EXPORT ", "export",
                           {"experiment": experiment, "export": "fails"})


COMMAND_KEYS = ["command", "command_checks", "command_reason"]
COMMAND_ALL = COMMAND_KEYS + ["command_best", "command_line", "command_max_rel_loss_diff",
                              "command_losses", "command_found", "command_commit", "command_cpu_s",
                              "command_first_loop_s", "command_process_cpu_s",
                              "command_empty_dirs_max_rel_loss_diff"]


def run_command_row(experiment: str, family: str, metrics: List[str], workdir: str,
                    log_dir: str) -> Dict[str, Any]:
    """One experiment through `python -m ctl.train` and Model Garden's trainer
    (bench/model_garden_zoo/command.py), from its own process.

    Args:
      experiment: a registered experiment's name.
      family: its family (the ranking experiments' process needs `TF_USE_LEGACY_KERAS=1`).
      metrics: the eval metrics its row says Model Garden reports (the best checkpoint's metric).
      workdir: the zoo's workdir (its generated data).
      log_dir: for the row's log.
    """
    log = os.path.join(log_dir, experiment.replace("/", "_") + "-command.log")
    command = [sys.executable, "-m", "bench.model_garden_zoo.command", experiment,
               f"--workdir={workdir}", f"--metrics={','.join(metrics)}",
               f"--budget_s={TIMEOUT_S - 100}"]  # Its trainers end before it is stopped.
    return _side_check_row(command, log, family, "ZOO-COMMAND ", "command",
                           {"experiment": experiment, "command": False})


def _side_check_row(command: List[str], log: str, family: str, prefix: str, column: str,
                    failed: Dict[str, Any]) -> Dict[str, Any]:
    """The fields of a row's export or command check, run in its own process (`_run_logged`): the last
    line it printed that starts with `prefix`, or `failed` with `<column>_reason` naming its last line;
    `<column>_commit` is the commit checked."""
    commit = _commit()
    lines = _run_logged(command, log, family)
    rows = [json.loads(line[len(prefix):]) for line in lines if line.startswith(prefix)]
    if rows:
        row = rows[-1]
    else:
        last = [line for line in lines if line.strip()][-1:] or ["no output"]
        row = {**failed, f"{column}_reason": f"the process ended without a result: {last[0][:300]}"}
    row[f"{column}_commit"] = commit
    return row


def write_export_results(path: str, rows: List[Dict[str, Any]], steps: int) -> None:
    """Writes each export check's fields into its experiment's row of the results file."""
    _write_fields(path, rows, EXPORT_KEYS + ["export_commit", "export_cpu_s"],
                  {"export_steps": steps})


def write_command_results(path: str, rows: List[Dict[str, Any]]) -> None:
    """Writes each command check's fields into its experiment's row of the results file."""
    from bench.model_garden_zoo import command

    _write_fields(path, rows, COMMAND_ALL, {"command_trainer": command.TRAINER})


def _write_fields(path: str, rows: List[Dict[str, Any]], keys: List[str],
                  run: Dict[str, Any]) -> None:
    """Replaces `keys` in each of `rows`' experiments' rows of the results file by the row's
    fields, and sets the file's `run` entries."""
    with open(path) as f:
        results = json.load(f)
    checked = {row["experiment"]: row for row in rows}
    for row in results["rows"]:
        if row["experiment"] in checked:
            for key in keys:
                row.pop(key, None)
            row.update({key: value for key, value in checked[row["experiment"]].items()
                        if key != "experiment"})
    results.update(run)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(results, f, indent=1)
    os.replace(tmp, path)


def _longest_first(names: List[str], path: str) -> List[str]:
    """`names` by the CPU time their rows took in the results file at `path` (if it has
    them), longest first, rows it does not time first of all: the last rows to start are
    short ones, so two rows at once end close together."""
    if not os.path.exists(path):
        return names
    with open(path) as f:
        took = {row["experiment"]: row.get("cpu_s") for row in json.load(f).get("rows", [])}
    return sorted(names, key=lambda name: -(took.get(name) or float("inf")))


def _round_robin(names: List[str], families: Dict[str, str]) -> List[str]:
    by_family: Dict[str, List[str]] = {}
    for name in names:
        by_family.setdefault(families[name], []).append(name)
    queues = list(by_family.values())
    ordered = []
    while any(queues):
        ordered += [queue.pop(0) for queue in queues if queue]
    return ordered


def _write_data(names: List[str], workdir: str) -> None:
    code = ("import sys; from bench.model_garden_zoo import registry, data; registry.import_all(); "
            "[data.data_overrides(n, sys.argv[2]) for n in sys.argv[1].split(',')]")
    subprocess.run([sys.executable, "-c", code, ",".join(names), os.path.join(workdir, "data")],
                   cwd=ROOT, env=_env(legacy_keras=False), check=True, capture_output=True)


def _commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                         text=True, check=False)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "ctl", "bench"],
                           cwd=ROOT, capture_output=True, text=True, check=False).stdout.strip()
    return out.stdout.strip() + ("+changes" if dirty else "")


def main(argv=None) -> int:
    global TIMEOUT_S  # --timeout_s: every row's processes' bound.
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiments", default="", help="comma-separated names (default: all)")
    parser.add_argument("--steps", type=int, default=6, help="training steps each way (K)")
    parser.add_argument("--results", default=RESULTS, help="the results file (JSON)")
    parser.add_argument("--workdir", default="", help="data and model dirs (default: a temp dir)")
    parser.add_argument("--jobs", type=int, default=1, help="experiments run at once (each in its process)")
    parser.add_argument("--longest_first", action="store_true",
                        help="start the rows that took longest in the --results file first "
                        "(default: each family's rows early)")
    parser.add_argument("--guarantees", nargs="?", const="with", default="", choices=["with", "only"],
                        help="add ctl's guarantees to each row (bench/model_garden_zoo/guarantees.py); "
                        "=only: run those alone, the rest of each row kept from --results")
    parser.add_argument("--export", action="store_true",
                        help="run the export check of each experiment (bench/model_garden_zoo/export.py) "
                        "and write its fields into the rows the --results file has")
    parser.add_argument("--command", action="store_true",
                        help="run each experiment's YAML through python -m ctl.train and Model "
                        "Garden's trainer (bench/model_garden_zoo/command.py) and write its "
                        "fields into the rows the --results file has")
    parser.add_argument("--timeout_s", type=int, default=TIMEOUT_S,
                        help="seconds a row may take (its processes are stopped then)")
    parser.add_argument("--collect", default="", help="write the results file from the rows a run "
                        "in this workdir has finished so far (the others say they were not run); "
                        "with --guarantees=only, write the guarantee columns of the rows whose "
                        "check ended into the rows of --results")
    args = parser.parse_args(argv)
    TIMEOUT_S = args.timeout_s
    if args.steps < 2:
        print(f"--steps={args.steps}: give at least 2 (the first step traces; s/step needs a second)",
              file=sys.stderr)
        return 2
    listing = _registered()
    families = listing["families"]
    if args.collect and args.guarantees == "only":
        return guarantees.collect(args.collect, families, args.results)
    if args.collect:
        return collect(args.collect, families, listing["failed"], args.steps, args.results)
    names = [n for n in args.experiments.split(",") if n] or list(families)
    unknown = [n for n in names if n not in families]
    if unknown:
        print(f"--experiments: {unknown} not registered with Model Garden's exp_factory here; "
              f"registered: {sorted(families)}", file=sys.stderr)
        return 2
    names = _round_robin(names, families)  # Each family early: a stopped run still covers them all.
    if args.longest_first:
        names = _longest_first(names, args.results)
    workdir = args.workdir or tempfile.mkdtemp(prefix="model_garden_zoo-")
    log_dir = os.path.join(workdir, "logs")
    os.makedirs(log_dir, exist_ok=True)
    if args.export:
        return export_main(names, families, args.steps, workdir, log_dir, args.jobs, args.results)
    if args.command:
        return command_main(names, families, workdir, log_dir, args.jobs, args.results)
    rows: List[Dict[str, Any]] = []
    loads = [os.getloadavg()[0]]
    start = time.time()
    with open(os.path.join(workdir, RUN_FILE), "w") as f:  # For --collect, if it is stopped.
        json.dump({"started": start, "jobs": max(1, args.jobs), "steps": args.steps,
                   "commit": _commit(), "guarantees": args.guarantees, "rows": len(names)}, f)
    _write_data(names, workdir)  # Once, before rows that share files run at once.

    def one(name):
        if args.guarantees == "only":
            row = guarantees.kept_row(args.results, name, families[name])
        else:
            row = run_row(name, families[name], args.steps, workdir, log_dir)
        if args.guarantees:
            row.update(guarantees.row_columns(guarantees.run_in_process(
                name, families[name], workdir, log_dir, _env(families[name] == "ranking"),
                TIMEOUT_S), _commit()))
        loads.append(os.getloadavg()[0])
        print(json.dumps({key: row.get(key) for key in KEYS}), flush=True)
        return row

    done = threading.Event()

    def sample_load():  # The host's load every 30 s while rows run (in a file for --collect).
        while not done.wait(30):
            loads.append(os.getloadavg()[0])
            with open(os.path.join(workdir, LOADS_FILE), "a") as f:
                f.write(f"{loads[-1]}\n")

    sampler = threading.Thread(target=sample_load, daemon=True)
    sampler.start()
    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        rows = list(pool.map(one, names))
    done.set()
    write_results(args.results, names, rows, families, listing["failed"], args.steps, start, loads,
                  partial=bool(args.experiments) or args.guarantees == "only", jobs=max(1, args.jobs))
    if args.guarantees:
        guarantees.record_run(args.results, workdir, len(names), len(families))
    print(f"results: {args.results} ({len(rows)} experiments, logs in {log_dir})", file=sys.stderr)
    return 0


def export_main(names: List[str], families: Dict[str, str], steps: int, workdir: str, log_dir: str,
                jobs: int, path: str) -> int:
    """`--export`: the export check of each of `names`, written into the results file's rows."""
    if not os.path.exists(path):
        print(f"--export writes into the rows of --results={path}, which does not exist; run the "
              "zoo without --export first", file=sys.stderr)
        return 2
    _write_data(names, workdir)
    return _check_each(names, jobs, lambda name: run_export_row(name, families[name], steps, workdir, log_dir),
                       EXPORT_KEYS, lambda rows: write_export_results(path, rows, steps), path, "export", log_dir)


def command_main(names: List[str], families: Dict[str, str], workdir: str, log_dir: str,
                 jobs: int, path: str) -> int:
    """`--command`: each of `names` through `python -m ctl.train`, written into the results file's
    rows."""
    if not os.path.exists(path):
        print(f"--command writes into the rows of --results={path}, which does not exist; run the "
              "zoo without --command first", file=sys.stderr)
        return 2
    with open(path) as f:  # The metrics each row's evaluation reported: the best checkpoint's.
        metrics = {row["experiment"]: list(row.get("eval") or {}) for row in json.load(f)["rows"]}
    _write_data(names, workdir)
    return _check_each(
        names, jobs, lambda name: run_command_row(name, families[name], metrics.get(name, []), workdir, log_dir),
        COMMAND_KEYS, lambda rows: write_command_results(path, rows), path, "command", log_dir)


def _check_each(names: List[str], jobs: int, check: Callable[[str], Dict[str, Any]], keys: List[str],
                write: Callable[[List[Dict[str, Any]]], None], path: str, what: str, log_dir: str) -> int:
    """Runs `check` on each of `names`, `jobs` at a time, printing each row's `keys` and writing it into
    the results file (`write`) as it ends: a stopped run keeps the rows it finished."""
    lock = threading.Lock()

    def one(name):
        row = check(name)
        print(json.dumps({key: row.get(key) for key in ["experiment"] + keys}), flush=True)
        with lock:
            write([row])
        return row

    with concurrent.futures.ThreadPoolExecutor(max(1, jobs)) as pool:
        rows = list(pool.map(one, names))
    print(f"results: {path} ({what} checks of {len(rows)} experiments, logs in {log_dir})",
          file=sys.stderr)
    return 0


def _logged_row(log: str):
    if not os.path.exists(log):
        return None
    with open(log) as f:
        rows = [json.loads(line[len("ZOO-ROW "):]) for line in f if line.startswith("ZOO-ROW ")]
    return rows[-1] if rows else None


def collect(workdir: str, families: Dict[str, str], failed, steps: int, path: str) -> int:
    """The results file from the rows a (stopped or running) run in `workdir` has finished."""
    log_dir = os.path.join(workdir, "logs")
    rows, finished = [], []
    for name in families:
        base = os.path.join(log_dir, name.replace("/", "_"))
        row = _logged_row(base + "-nodet.log") or _logged_row(base + ".log")
        if row is None:
            row = {key: None for key in KEYS}
            row.update(experiment=name, reason="not measured: the zoo run was stopped before this row")
        else:
            finished.append(os.path.getmtime(base + ".log"))
            if os.path.exists(base + "-nodet.log"):
                row["determinism_note"] = DETERMINISM_NOTE
        row["family"] = families[name]
        rows.append(row)
    # The run's start, jobs and load samples as it recorded them (a log dir's ctime is that of
    # its newest file).
    run_file, loads_file = os.path.join(workdir, RUN_FILE), os.path.join(workdir, LOADS_FILE)
    run = {"started": os.path.getctime(log_dir), "jobs": 1}
    if os.path.exists(run_file):
        with open(run_file) as f:
            run.update(json.load(f))
    loads = []
    if os.path.exists(loads_file):
        with open(loads_file) as f:
            loads = [float(line) for line in f if line.strip()]
    write_results(path, list(families), rows, families, failed, steps, run["started"],
                  loads or [os.getloadavg()[0]], partial=False, jobs=run["jobs"],
                  end=max(finished) if finished else None)
    print(f"results: {path} ({len(finished)} of {len(rows)} rows measured)", file=sys.stderr)
    return 0


def write_results(path, names, rows, families, failed, steps, start, loads, partial,
                  jobs: int = 1, end=None) -> None:
    """The results file: every row, the commit, the time (from `start` to `end`, default now)
    and the host's load."""
    end = time.time() if end is None else end
    results = {"commit": _commit(), "steps": steps, "jobs": jobs, "started": time.strftime(
        "%Y-%m-%d %H:%M UTC", time.gmtime(start)), "minutes": round((end - start) / 60, 1),
        "cpus": os.cpu_count(), "load_1min": {"min": min(loads), "max": max(loads),
                                              "mean": round(sum(loads) / len(loads), 1)},
        "registered": len(families), "imports_failed": failed, "rows": rows,
        "cpu_minutes": round(sum(row.get("cpu_s") or 0 for row in rows) / 60, 1)}
    if partial and os.path.exists(path):  # A run of some experiments updates their rows only.
        with open(path) as f:
            previous = json.load(f)
        kept = [r for r in previous.get("rows", []) if r["experiment"] not in set(names)]
        order = {name: k for k, name in enumerate(families)}
        results["rows"] = sorted(kept + rows, key=lambda r: order.get(r["experiment"], len(order)))
        results["updated"] = {row["experiment"]: row.get("commit") for row in rows}
        for key in ("commit", "started", "minutes", "load_1min", "jobs", "cpu_minutes"):
            results[key] = previous.get(key, results[key])
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(results, f, indent=1)
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
