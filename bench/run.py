"""Runs ctl's benchmark suite: `python -m bench.run [--quick] [--only FIGURE,...]`.

Each figure runs in its own process (a fresh TensorFlow), one after the
other; every result is printed as one JSON line and all of them are written to
`bench/results/latest.json` together with the command, the time and the load
average (the machine may be shared: compare ratios, not absolute rates). The
figures' own logs go to `bench/results/<figure>.log`.

The sidecar latency figure comes from `bench/sidecar_latency.py` when it is
present; otherwise a JSON line says it was skipped.

`--repeat N` runs each in-process figure (throughput, controller cost, stall)
N times, each time in a fresh process, and reports per line the median of
every number over the N processes, with `spread` ([min, max] of each) and
`met_runs` (in how many processes the target was met; `met`: in most). The
figures that launch processes themselves (startup, resume_cost, main_job,
object_store, sidecar_latency) already take medians over their rounds and run once.

`--against DIR` times the same figures in another checkout of ctl too (a
`git worktree` at an older commit), its processes alternating with this
checkout's in one session (this, other; other, this; ...: load that comes and
goes falls on both; `--repeat` pairs of processes, every figure included); each line names its
`checkout` (`this` or `against`).
`--figure_args` adds arguments to every figure's command (e.g.
`--figure_args="--workloads mlp --variants ctl,raw_fused_b"`). Every line
records the one-minute load average at its process's end (`load_average`).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results")

# figure -> (command after `python`, full arguments, --quick arguments)
FIGURES = {
    "train_throughput": (["-m", "bench.train_throughput"],
                         ["--rounds", "15"], ["--rounds", "3"]),
    "eval_throughput": (["-m", "bench.eval_throughput"],
                        ["--rounds", "15"], ["--rounds", "3"]),
    "controller_cost": (["-m", "bench.controller_cost", "--figures", "controller_cost"],
                        ["--rounds", "11", "--train_steps", "30000"],
                        ["--rounds", "2", "--train_steps", "2000", "--interval", "1000"]),
    "checkpoint_stall": (["-m", "bench.controller_cost", "--figures", "checkpoint_stall"],
                         ["--rounds", "5"], ["--rounds", "2", "--saves", "2"]),
    "startup": (["-m", "bench.startup"], ["--rounds", "4"], ["--rounds", "1"]),
    "sidecar_latency": (["bench/sidecar_latency.py"], [], ["--checkpoints", "8"]),
    "main_job": (["-m", "bench.main_job"], ["--rounds", "3"], ["--rounds", "1"]),
    "object_store": (["-m", "bench.object_store"], ["--rounds", "2"],
                     ["--rounds", "1", "--latencies", "50", "--checkpoints", "3",
                      "--sidecar_intervals", "2"]),
    "resume_cost": (["-m", "bench.resume_cost"], ["--rounds", "2"],
                    ["--rounds", "1", "--steps", "0,10000000", "--pipelines", "digits"]),
    "train_step_speed": (["-m", "bench.train_step_speed"], ["--rounds", "5"],
                         ["--rounds", "2", "--loops", "1"]),
    "sweep": (["-m", "bench.sweep"], [], []),  # Minutes even in --quick: four whole searches.
    "model_garden_speed": (["-m", "bench.model_garden_speed"], ["--rounds", "10"],
                           ["--rounds", "2", "--loops", "1",
                            "--experiments", "bert/sentence_prediction"]),
}
# Figures whose every round is a new process already: run once under --repeat.
SELF_REPEATING = {"startup", "sidecar_latency", "resume_cost", "main_job", "object_store", "sweep",
                  "model_garden_speed"}
# Targets of figures whose scripts report none themselves: figure -> (field, bound).
TARGETS = {"sidecar_latency": ("median_s", 0.2)}
TIMEOUT_S = 900  # Figure 1 with both workloads: 270-330 s on this host, 546-598 s on a slow day (2026-11-25e).
# object_store's two rounds: 14 main-job processes of 15-60 s each and the sidecar;
# model_garden_speed: three Model Garden experiments, each built three times.
LONG_TIMEOUTS_S = {"object_store": 3600, "sweep": 3600, "model_garden_speed": 3600}


def run_figure(name, quick, root=ROOT, extra=(), checkout=None):
    """The figure's records from one process in the checkout at `root` (`extra`: arguments
    added to its command; `checkout`: the name its records carry, and its log's suffix)."""
    command, full_args, quick_args = FIGURES[name]
    if command[0].endswith(".py") and not os.path.exists(os.path.join(root, command[0])):
        return [{"figure": name, "skipped": f"{command[0]} is not in this checkout"}]
    argv = [sys.executable, *command, *(quick_args if quick else full_args), *extra]
    env = {**os.environ, "PYTHONPATH": root}
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    timeout = LONG_TIMEOUTS_S.get(name, TIMEOUT_S)
    start = time.perf_counter()
    log_name = f"{name}-{checkout}.log" if checkout else f"{name}.log"
    with open(os.path.join(RESULTS, log_name), "w") as log:
        try:
            result = subprocess.run(argv, cwd=root, env=env, stdout=subprocess.PIPE,
                                    stderr=log, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as error:
            stdout, returncode = error.stdout or "", f"timeout after {timeout} s"
        else:
            stdout, returncode = result.stdout, result.returncode
    records = []
    for line in stdout.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    if returncode != 0 or not records:
        records.append({"figure": name, "error": f"exit {returncode}; see bench/results/{log_name}"})
    for record in records:
        record.setdefault("figure", name)
        record["load_average"] = round(os.getloadavg()[0], 2)
        if checkout:
            record["checkout"] = checkout
        field, bound = TARGETS.get(name, (None, None))
        if field in record and "target" not in record:
            record.update(target=f"{field} <= {bound}", met=record[field] <= bound)
        record.setdefault("seconds", round(time.perf_counter() - start, 1))
    return records


LISTED = ("order_seed",)  # Numbers that say how a run was made, not what it measured.


def combine(runs):
    """The records of repeated runs of one figure, one per line identity, as medians with spread.

    A line's identity is its figure and its non-numeric fields (variant,
    workload, ...); numbers become their median over the runs, with
    `spread[field] = [min, max]`, except those in `LISTED`, which become the
    list of each run's value.
    """
    groups = {}
    for records in runs:
        for record in records:
            key = tuple(sorted((k, json.dumps(v)) for k, v in record.items()
                               if not _numeric(v) and k not in ("met", "met_in_cpu_time")))
            groups.setdefault(key, []).append(record)
    combined = []
    for records in groups.values():
        line = {k: v for k, v in records[0].items() if not _numeric(v)}
        spread = {}
        for field in records[0]:
            values = [r[field] for r in records if _numeric(r.get(field))]
            if field in LISTED:
                line[field] = values
            elif values and _numeric(records[0][field]):
                line[field] = statistics.median(values)
                if len(values) > 1:
                    spread[field] = [min(values), max(values)]
        for flag in ("met", "met_in_cpu_time"):
            flags = [r[flag] for r in records if isinstance(r.get(flag), bool)]
            if flags:
                line[flag] = sum(flags) > len(flags) / 2
                line[f"{flag}_runs"] = f"{sum(flags)}/{len(flags)}"
        line.update(repeats=len(records), spread=spread)
        combined.append(line)
    return combined


def _numeric(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few rounds: a smoke run")
    parser.add_argument("--out", default="latest.json", help="a file name (under bench/results) or a path")
    parser.add_argument("--repeat", type=int, default=1,
                        help="processes per in-process figure; lines report medians and spread")
    parser.add_argument("--only", default=",".join(FIGURES), help="comma-separated figures")
    parser.add_argument("--against", default=None,
                        help="another checkout of ctl: its figures too, processes alternating")
    parser.add_argument("--figure_args", default="", help="arguments added to every figure's command")
    args = parser.parse_args()
    extra = args.figure_args.split()
    if args.against and not os.path.isdir(os.path.join(args.against, "bench")):
        parser.error(f"--against: {args.against!r} is not a checkout of ctl (no bench/ in it)")
    names = args.only.split(",")
    unknown = [n for n in names if n not in FIGURES]
    if unknown:
        parser.error(f"--only: unknown figure(s) {unknown}; expected some of {list(FIGURES)}")
    os.makedirs(RESULTS, exist_ok=True)
    report = {
        "command": " ".join(["python -m bench.run", *sys.argv[1:]]),
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpus": os.cpu_count(),
        "load_average_before": os.getloadavg(),
        "results": [],
    }
    for checkout, root in (("this", ROOT), ("against", args.against)):
        if root:
            report[f"commit_{checkout}"] = subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True,
                text=True).stdout.strip()
    start = time.perf_counter()
    for name in names:
        repeats = 1 if name in SELF_REPEATING and not args.against else max(1, args.repeat)
        if args.against:  # this, other; other, this; ...: each pair in the other order.
            runs = []
            for i in range(repeats):
                pair = [(ROOT, "this"), (os.path.abspath(args.against), "against")]
                for root, checkout in pair[::-1] if i % 2 else pair:
                    runs.append(run_figure(name, args.quick, root, extra, checkout))
            repeats = len(runs)
        else:
            runs = [run_figure(name, args.quick, extra=extra) for _ in range(repeats)]
        for record in runs[0] if repeats == 1 else combine(runs):
            print(json.dumps(record), flush=True)
            report["results"].append(record)
    report["load_average_after"] = os.getloadavg()
    report["total_seconds"] = round(time.perf_counter() - start, 1)
    # A bare name goes to bench/results/; a path (bench/results/x.json) is taken as given.
    path = args.out if os.path.dirname(args.out) else os.path.join(RESULTS, args.out)
    with open(f"{path}.tmp", "w") as f:
        json.dump(report, f, indent=1)
    os.replace(f"{path}.tmp", path)
    print(json.dumps({"written": os.path.relpath(path, ROOT),
                      "total_seconds": report["total_seconds"]}), flush=True)


if __name__ == "__main__":
    main()
