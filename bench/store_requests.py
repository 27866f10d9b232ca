"""Every object-store request of the main job, and which ones the training thread waits for.

    python -m bench.store_requests [--latency_ms=50] [--train_steps=2000] [--out=FILE]
        [--storages=gs] [--rounds=1]

Starts the test GCS API (tests/gcs) at `--latency_ms` a request, logs every
request it answers (`GcsService.log_requests`), and runs the main job
(`python -m ctl.run --mode=train_and_eval --gin_file=configs/digits.gin`,
`--train_steps` steps) on `gs://` in a child that wraps `tf.io.gfile`'s
functions and `GFile`'s methods with a clock, noting each call's thread and
the ctl function that made it. Prints one line per call the main thread
waited on, in order (its start after launch, its seconds, the requests the
store answered meanwhile, the call, the object, the ctl caller), then one
JSON line: the process's seconds, the main thread's seconds in store calls
(`main_thread_store_s`), its calls, and the requests in all and off the main
thread. A checkpoint's own write and read (TensorFlow's C++ file system) and
the summary writer (staged on the local disk) make no `tf.io.gfile` call:
their requests are counted, not named.

The child also times, on the main thread, the phases of the process and the
functions where it waits (`WAITS`: a checkpoint's save and its upload slot,
the waits for uploads, a read ahead's result, the lease's steps, the run's
closing lines, the summaries' and checkpoints' closes), and the parent adds
launch and exit. `--storages=local,gs` runs the job on a local dir too, then
prints one table: each phase's and each wait's seconds per storage (the median
of `--rounds` processes each) and gs over local, so that what the store adds
to the whole process is named phase by phase (`PHASES`).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FUNCTIONS = ("exists", "isdir", "makedirs", "rmtree", "glob", "stat", "remove", "listdir",
             "walk", "rename", "copy")
GFILE_METHODS = ("read", "write", "flush", "close", "readline", "readlines", "size", "seek")


def _caller() -> str:
    """The innermost ctl frame of the current stack outside `ctl/model_dir/files.py` (the
    file helpers), as `path:line function`."""
    frame = sys._getframe(2)
    while frame is not None:
        path = frame.f_code.co_filename
        if (os.sep + "ctl" + os.sep in path and "bench" not in path
                and not path.endswith(os.path.join("model_dir", "files.py"))):
            return f"{os.path.relpath(path, ROOT)}:{frame.f_lineno} {frame.f_code.co_name}"
        frame = frame.f_back
    return "?"


# Functions whose calls on the main thread the child times, by (module, attribute path).
TIMED = (
    ("ctl.train_lib", "run_experiment"), ("ctl.train_lib", "build_controller"),
    ("ctl.core.controller", "Controller._train_n_steps"),
    ("ctl.core.controller", "Controller.evaluate"),
    ("ctl.core.controller", "Controller.train_and_evaluate"),
    ("ctl.core.controller", "Controller._save"),
    ("ctl.core.controller", "Controller._wait_for_checkpoints"),
    ("ctl.core.controller", "Controller.flush_summaries"),
    ("ctl.core.checkpointing", "CheckpointManager.save"),
    ("ctl.core.checkpointing", "CheckpointManager.sync"),
    ("ctl.core.checkpointing", "CheckpointManager.close"),
    ("ctl.core.checkpointing", "CheckpointManager.restore_or_initialize"),
    ("ctl.core.summaries", "SummaryManager.close"),
    ("ctl.model_dir.at_once", "Ahead.result"),
    ("ctl.model_dir.at_once", "at_once"),
    ("ctl.model_dir.background", "Uploads.wait"),
    ("ctl.model_dir.trainer_lock", "ModelDirLock.acquire_aside"),
    ("ctl.model_dir.trainer_lock", "ModelDirLock.decided"),
    ("ctl.model_dir.trainer_lock", "ModelDirLock.ending"),
    ("ctl.model_dir.trainer_lock", "ModelDirLock.release"),
    ("ctl.model_dir.trainer_lock", "ModelDirLock.join_aside"),
    ("ctl.run_end", "say_done"),
    ("ctl.core.contract", "check_run"), ("ctl.core.contract", "check_eval"),
    ("ctl.model_dir.lease", "Lease.try_acquire"),
)
# The process's phases, one after the other on the main thread: (name, what it spans).
PHASES = (
    ("start", "launch to run_experiment: Python, TensorFlow's import, flags, gin"),
    ("build", "run_experiment to the first train loop: build, restore, checks' traces, lease"),
    ("train", "the first train loop's start to the last one's end (its saves and evaluations)"),
    ("final", "the last train loop's end to train_and_evaluate's return (the last evaluation, "
              "the final save, its upload)"),
    ("end", "train_and_evaluate's return to run_experiment's (finished mark, closing lines, "
            "closes, the lease's release)"),
    ("exit", "run_experiment's return to the process's end"),
)
# Waits named in the table: the timed functions a store can make the main thread wait in.
WAITS = ("CheckpointManager.save", "CheckpointManager.sync", "CheckpointManager.close",
         "SummaryManager.close", "Uploads.wait", "Ahead.result", "at_once",
         "ModelDirLock.acquire_aside", "ModelDirLock.decided", "ModelDirLock.ending",
         "ModelDirLock.release", "ModelDirLock.join_aside", "say_done",
         "CheckpointManager.restore_or_initialize", "Controller.evaluate",
         "Controller._train_n_steps")


def _time_functions(marks, lock) -> None:
    """Wraps `TIMED` so that each call appends its name, start, end and thread to `marks`."""
    import importlib

    def wrap(name, fn):
        def timed(*args, **kwargs):
            start = time.time()
            try:
                return fn(*args, **kwargs)
            finally:
                with lock:
                    marks.append({"name": name, "start": start, "end": time.time(),
                                  "thread": threading.current_thread().name})
        return timed

    for module_name, attribute in TIMED:
        owner = importlib.import_module(module_name)
        *classes, name = attribute.split(".")
        for part in classes:
            owner = getattr(owner, part)
        setattr(owner, name, wrap(attribute, getattr(owner, name)))


SAMPLE_S = 0.005  # The main thread's stack, sampled every so often (`--samples`).


def _innermost_ctl(frame) -> str:
    """`path:line function` of the innermost ctl frame of a stack (not the bench's), or ?."""
    while frame is not None:
        path = frame.f_code.co_filename
        if os.sep + "ctl" + os.sep in path and os.sep + "bench" + os.sep not in path:
            return f"{os.path.relpath(path, ROOT)}:{frame.f_lineno} {frame.f_code.co_name}"
        frame = frame.f_back
    return "?"


def _sample_main_thread(samples, stop: threading.Event) -> None:
    """Appends (time, innermost ctl frame, innermost frame's function) of the main thread every
    `SAMPLE_S` until `stop`: where its time goes between the timed functions' marks."""
    main = threading.main_thread().ident
    while not stop.wait(SAMPLE_S):
        frame = sys._current_frames().get(main)
        if frame is not None:
            ctl = _innermost_ctl(frame)
            inner = f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_code.co_name}"
            if os.environ.get("CTL_BENCH_SAMPLES") == "stacks":  # Every frame, outermost last.
                stack = []
                while frame is not None:
                    stack.append(f"{os.path.basename(frame.f_code.co_filename)}:"
                                 f"{frame.f_lineno}:{frame.f_code.co_name}")
                    frame = frame.f_back
                inner = ";".join(stack[:40])
            samples.append((time.time(), ctl, inner))


def _child(calls_path: str, argv) -> None:
    import runpy

    import tensorflow as tf

    records = []
    marks = []
    lock = threading.Lock()
    _time_functions(marks, lock)
    samples = []
    stop_sampling = threading.Event()
    if os.environ.get("CTL_BENCH_SAMPLES"):
        threading.Thread(target=_sample_main_thread, args=(samples, stop_sampling),
                         daemon=True).start()

    def timed(name, fn, path_of):
        def call(*args, **kwargs):
            start = time.time()
            try:
                return fn(*args, **kwargs)
            finally:
                end = time.time()
                path = path_of(args)
                if isinstance(path, str) and path.startswith("gs://"):
                    with lock:
                        records.append({"start": start, "end": end, "call": name, "path": path,
                                        "thread": threading.current_thread().name,
                                        "caller": _caller()})
        return call

    for name in FUNCTIONS:
        setattr(tf.io.gfile, name, timed(name, getattr(tf.io.gfile, name),
                                         lambda args: args[0] if args else None))
    gfile = tf.io.gfile.GFile
    for name in GFILE_METHODS:
        if hasattr(gfile, name):
            setattr(gfile, name, timed(f"GFile.{name}", getattr(gfile, name),
                                       lambda args: getattr(args[0], "name", None)))
    sys.argv = ["ctl.run", *argv]
    try:
        runpy.run_module("ctl.run", run_name="__main__")
    except SystemExit as error:
        if error.code:
            raise
    finally:
        with open(calls_path, "w") as out:
            out.writelines(json.dumps(record) + "\n" for record in records)
        with open(calls_path + ".marks", "w") as out:
            out.writelines(json.dumps(mark) + "\n" for mark in marks)
        stop_sampling.set()
        with open(calls_path + ".samples", "w") as out:
            out.writelines(json.dumps(sample) + "\n" for sample in list(samples))


def phases(marks, launched: float, ended: float):
    """{phase: seconds} and {wait: seconds} (summed over its calls; outermost calls only) from
    the child's `marks`, the launch and the end of its process."""
    def calls(name):  # On the main thread.
        return [m for m in marks if m["name"] == name and m["thread"] == "MainThread"]

    (run,) = calls("run_experiment")
    (both,) = calls("Controller.train_and_evaluate")
    loops = calls("Controller._train_n_steps")
    bounds = [launched, run["start"], loops[0]["start"], loops[-1]["end"], both["end"],
              run["end"], ended]
    table = {name: bounds[i + 1] - bounds[i] for i, (name, _) in enumerate(PHASES)}
    waits = {}
    for name in WAITS:
        own = sorted(calls(name), key=lambda m: m["start"])
        outer, last_end = [], 0.0
        for m in own:  # A wait that calls itself (a nested wrapper) counts once.
            if m["start"] >= last_end:
                outer.append(m)
                last_end = m["end"]
        waits[name] = (sum(m["end"] - m["start"] for m in outer), len(outer))
    return table, waits


def phase_table(results) -> str:
    """The text table of `{storage: [(phases, waits), ...]}`: medians per storage, gs over local."""
    storages = list(results)

    def median(values):
        values = sorted(values)
        middle = len(values) // 2
        return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2

    header = "| phase or wait | " + " | ".join(storages) + (
        " | gs - local |" if {"local", "gs"} <= set(storages) else " |")
    lines = [header, "|---" * (header.count("|") - 1) + "|"]

    def row(label, values):
        cells = [f"{values[s]:.2f}" for s in storages]
        if {"local", "gs"} <= set(storages):
            cells.append(f"{values['gs'] - values['local']:+.2f}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")

    for name, _ in PHASES:
        row(name, {s: median([r[0][name] for r in results[s]]) for s in storages})
    row("**whole process**", {s: median([sum(r[0].values()) for r in results[s]])
                              for s in storages})
    for name in WAITS:
        seconds = {s: median([r[1][name][0] for r in results[s]]) for s in storages}
        counts = {s: median([r[1][name][1] for r in results[s]]) for s in storages}
        if max(seconds.values()) >= 0.005:
            row(f"{name} ({'/'.join(f'{counts[s]:g}' for s in storages)} calls)", seconds)
    return "\n".join(lines)


def run_job(storage: str, train_steps: int, scratch: str, service=None):
    """Runs the main job once in the child on `storage` (local, gs); returns the process's
    launch and end times, its store calls (sorted) and its marks."""
    name = f"{storage}-{uuid.uuid4().hex[:6]}"
    calls_log = os.path.join(scratch, f"calls-{name}.jsonl")
    if storage == "gs":
        model_dir, env = f"gs://{service.bucket}/main-{name}", service.env()
    else:
        model_dir, env = os.path.join(scratch, name), {}
    command = [sys.executable, "-m", "bench.store_requests", f"--child={calls_log}",
               "--mode=train_and_eval", "--gin_file=configs/digits.gin",
               f"--gin.TRAIN_STEPS={train_steps}", f"--model_dir={model_dir}"]
    launched = time.time()
    done = subprocess.run(command, cwd=ROOT, env={**os.environ, **env, "PYTHONPATH": ROOT},
                          capture_output=True, text=True, check=False, timeout=1800)
    ended = time.time()
    if done.returncode:
        raise SystemExit(f"the main job failed: {done.stderr[-3000:]}")
    with open(calls_log) as f:
        calls = sorted((json.loads(line) for line in f), key=lambda c: c["start"])
    with open(calls_log + ".marks") as f:
        marks = [json.loads(line) for line in f]
    return launched, ended, calls, marks


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency_ms", type=int, default=50)
    parser.add_argument("--train_steps", type=int, default=2000)
    parser.add_argument("--out", default="")
    parser.add_argument("--storages", default="gs",
                        help="comma-separated, run in this order each round: local, gs")
    parser.add_argument("--rounds", type=int, default=1, help="processes per storage")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args(argv)
    if args.child:
        _child(args.child, rest)
        return 0
    storages = args.storages.split(",")
    if not storages or not set(storages) <= {"local", "gs"} or len(set(storages)) != len(storages):
        parser.error(f"--storages: expected some of local, gs; received {args.storages!r}")
    if args.rounds < 1:
        parser.error(f"--rounds ({args.rounds}) must be positive")
    sys.path.insert(0, ROOT)
    from tests.gcs.service import GcsService

    scratch = tempfile.mkdtemp(prefix="ctl-store-requests-")
    requests_log = os.path.join(scratch, "requests.jsonl")
    load_before = os.getloadavg()
    service = GcsService(latency_ms=args.latency_ms)
    results = {storage: [] for storage in storages}
    gs_runs = []
    try:
        service.log_requests(requests_log)
        for _ in range(args.rounds):
            for storage in storages:
                launched, ended, calls, marks = run_job(storage, args.train_steps, scratch,
                                                        service)
                results[storage].append(phases(marks, launched, ended))
                if storage == "gs":
                    gs_runs.append((launched, ended, calls))
    finally:
        service.stop()
    with open(requests_log) as f:
        all_requests = [json.loads(line) for line in f]
    lines = []
    summary = {"figure": "store_requests", "latency_ms": args.latency_ms,
               "train_steps": args.train_steps, "rounds": args.rounds,
               "load_average_before": [round(x, 2) for x in load_before]}
    if gs_runs:  # The last gs process's calls, named one by one.
        launched, ended, calls = gs_runs[-1]
        requests = [r for r in all_requests if launched <= r["start"] <= ended]
        main_calls = [c for c in calls if c["thread"] == "MainThread"]
        for c in main_calls:
            during = [r for r in requests if c["start"] <= r["start"] <= c["end"]]
            lines.append(f"+{c['start'] - launched:7.3f}s {c['end'] - c['start']:6.3f}s "
                         f"{len(during):2d} req  {c['call']:<12} {c['path'].split('/', 3)[-1]:<40} "
                         f"<- {c['caller']}")
        in_main = sum(1 for r in requests if any(c["start"] <= r["start"] <= c["end"]
                                                for c in main_calls))
        summary.update({
            "seconds": round(ended - launched, 2),
            "main_thread_store_s": round(sum(c["end"] - c["start"] for c in main_calls), 2),
            "main_thread_calls": len(main_calls), "requests": len(requests),
            "requests_during_main_thread_calls": in_main,
            "calls_by_thread": {t: sum(1 for c in calls if c["thread"] == t)
                                for t in sorted({c["thread"] for c in calls})}})
    summary["phases"] = {storage: [{**table, "waits": {k: round(v[0], 3) for k, v in waits.items()}}
                                   for table, waits in runs] for storage, runs in results.items()}
    summary["load_average"] = round(os.getloadavg()[0], 2)
    table = phase_table(results)
    print("\n".join(lines))
    print(table)
    print(json.dumps(summary))
    if args.out:
        with open(args.out, "w") as out:
            out.write("\n".join(lines) + "\n" + table + "\n" + json.dumps(summary) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
