"""Figure 9: the main job with its model dir in an object store, against a local dir.

    python -m bench.object_store [--rounds 2] [--latencies 0,50] [--checkpoints 10]
        [--sidecar_intervals 2,8] [--systems ctl,mg] [--train_steps 10000] [--trace 1]

Starts the test GCS API (tests/gcs: an emulator, as Google's hosts, on 127.0.0.1)
once, then times, interleaved (measure.interleave), whole processes of the
main job (figure 8's commands: digits, `--train_steps` steps, configs/digits.gin's
intervals) for ctl and for Model Garden (bench/mg_digits.py), each on a fresh
model dir: a local one, and `gs://` with each of `--latencies` milliseconds
added by the emulator to every request (a bucket's round trip). The latency is
set just before each `gs://` run (`GcsService.set_latency`).

Reports per system its median seconds per storage and `gs@N / local` per
latency (target: ctl's `gs@50 / local` <= 2.0, the store's latency hidden
behind training), and ctl over Model Garden at each latency. Then runs
bench/sidecar_latency.py on `gs://` at the highest latency (`--checkpoints`;
0 skips it), once per `--sidecar_intervals` (seconds between checkpoints):
from a checkpoint being committed in the bucket to the sidecar starting its
evaluation, median target <= 2 s. At the main job's cadence (a checkpoint
every 2 s) that includes the wait behind the previous evaluation when the
sidecar's cycle is longer; at 8 s it is the sidecar's own reaction.

`--trace 1` runs each ctl process under `py-spy record` (the `bench` extra)
and adds `training_thread_store_s` per storage: the seconds the main thread
spent in TensorFlow's file calls (`tf.io.gfile`, a checkpoint's write) or
blocked in ctl's waits (a source line that acquires, sleeps or waits: the
upload slot, the uploads' end, the lease's settling). A wait on the store is
mostly its latency, not CPU, so the figure moves less with the host's load
than the ratio, whose local run slows with it; gs@N's value over local's is
what the store still costs the training thread.
"""

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

from bench import measure
from bench import main_job
from bench.main_job import ROOT
from tests.gcs.service import GcsService

COMMANDS = {
    "ctl": lambda steps: [sys.executable, "-m", "ctl.run", "--mode=train_and_eval",
                          "--gin_file=configs/digits.gin", f"--gin.TRAIN_STEPS={steps}"],
    "mg": lambda steps: [sys.executable, "bench/mg_digits.py", f"--train_steps={steps}"],
}
TIMEOUT_S = 900  # Model Garden on gs@50: over 300 s with the 2-core host at a load average of 15.
RATIO_TARGET = 2.0
SIDECAR_TARGET_S = 2.0


def run_once(command, model_dir, env, trace=None):
    """Seconds the whole process takes (figure 8's, with the GCS env); raises if it fails.
    `trace`: a path for py-spy's raw samples of the process (then run under `py-spy record`)."""
    if trace:
        command = [shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy"),
                   "record", "--idle", "--threads", "--format", "raw", "-r", str(TRACE_HZ), "-o", trace,
                   "--", *command]
    return main_job.run_once(command, model_dir, env=env, timeout=TIMEOUT_S)


TRACE_HZ = 50
_WAITS = ("acquire(", "sleep(", "wait(", "wait_for(")


def training_thread_store_s(trace: str) -> float:
    """Seconds of the main thread's samples in `trace` (py-spy raw) in TensorFlow's file calls
    or in a ctl line that acquires, sleeps or waits (see the module's docstring)."""
    lines = collections.defaultdict(dict)

    def source(path, number):
        if number not in lines[path]:
            try:
                with open(os.path.join(ROOT, path)) as f:
                    lines[path] = dict(enumerate(f, 1))
            except OSError:
                lines[path] = {}
        return lines[path].get(number, "")

    samples = 0
    with open(trace) as f:
        for line in f:
            stack, _, count = line.rstrip().rpartition(" ")
            frames = stack.split(";")
            if "MainThread" not in frames[0]:
                continue
            if any("lib/io/file_io.py" in frame for frame in frames):
                samples += int(count)
                continue
            ctl_frames = [frame for frame in frames if "(ctl/" in frame]
            if ctl_frames and frames[-1] == ctl_frames[-1]:  # Blocked in a ctl line (C below it).
                path, _, number = ctl_frames[-1].rsplit("(", 1)[1].rstrip(")").partition(":")
                if any(wait in source(path, int(number)) for wait in _WAITS):
                    samples += int(count)
    return samples / TRACE_HZ


def storages(latencies):
    """The storage names: local, then gs@N per latency."""
    return ["local", *(f"gs@{ms}" for ms in latencies)]


def ratios(seconds, latencies):
    """From {system: {storage: [seconds per round]}}: medians and the figure's ratios."""
    medians = {system: {storage: measure.median(times) for storage, times in per.items()}
               for system, per in seconds.items()}
    lines = {}
    for system, per in medians.items():
        lines[system] = dict(seconds=per, **{
            f"gs@{ms}_over_local": per[f"gs@{ms}"] / per["local"] for ms in latencies})
    if {"ctl", "mg"} <= set(medians):
        for storage in storages(latencies):
            lines["ctl"][f"ctl_over_mg_{storage}"] = medians["ctl"][storage] / medians["mg"][storage]
    return lines


def parse_latencies(text):
    try:
        latencies = [int(part) for part in text.split(",")]
    except ValueError:
        latencies = []
    if not latencies or any(ms < 0 for ms in latencies) or len(set(latencies)) != len(latencies):
        raise argparse.ArgumentTypeError(
            f"expected distinct non-negative milliseconds separated by commas (e.g. 0,50); "
            f"received {text!r}")
    return latencies


def sidecar_latency(service, latency_ms, checkpoints, interval):
    """bench/sidecar_latency.py's JSON result, on gs:// at `latency_ms`, a checkpoint every
    `interval` seconds."""
    service.set_latency(latency_ms)
    model_dir = f"gs://{service.bucket}/sidecar-{uuid.uuid4().hex[:8]}"
    result = subprocess.run(
        [sys.executable, "bench/sidecar_latency.py", f"--model_dir={model_dir}",
         f"--checkpoints={checkpoints}", f"--interval={interval}"],
        cwd=ROOT, env={**os.environ, **service.env(), "PYTHONPATH": ROOT},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=TIMEOUT_S)
    if result.returncode != 0:
        raise RuntimeError(f"sidecar_latency exited {result.returncode}: {result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--train_steps", type=int, default=10000)
    parser.add_argument("--latencies", type=parse_latencies, default=[0, 50],
                        help="milliseconds added to each request, one gs:// run per value per round")
    parser.add_argument("--systems", default="ctl,mg", help="comma-separated: ctl, mg")
    parser.add_argument("--checkpoints", type=int, default=10,
                        help="checkpoints of the sidecar measurement (0: none)")
    parser.add_argument("--sidecar_intervals", default="2,8",
                        help="seconds between the sidecar measurement's checkpoints, one run each: "
                             "the main job's cadence (2), and slower than the sidecar's cycle (8)")
    parser.add_argument("--warm", type=int, choices=(0, 1), default=1,
                        help="1: one untimed local run per system first (warms file caches)")
    parser.add_argument("--trace", type=int, choices=(0, 1), default=0,
                        help="1: ctl's runs under py-spy, adding training_thread_store_s")
    args = parser.parse_args(argv)
    systems = args.systems.split(",")
    if not systems or any(s not in COMMANDS for s in systems) or len(set(systems)) != len(systems):
        parser.error(f"--systems: expected some of {list(COMMANDS)}, received {args.systems!r}")
    try:
        intervals = [float(x) for x in args.sidecar_intervals.split(",")]
    except ValueError:
        intervals = []
    if not intervals or any(x < 0 for x in intervals):
        parser.error(f"--sidecar_intervals: expected non-negative seconds separated by commas "
                     f"(e.g. 2,8), received {args.sidecar_intervals!r}")
    if args.rounds < 1 or args.train_steps < 1:
        parser.error(f"--rounds ({args.rounds}) and --train_steps ({args.train_steps}) "
                     "must be positive")
    measure.claim_stdout()
    load_before = os.getloadavg()
    started_utc = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    scratch = tempfile.mkdtemp(prefix="ctl-object-store-")
    service = GcsService()
    seconds = {system: {storage: [] for storage in storages(args.latencies)} for system in systems}
    store_s = {storage: [] for storage in storages(args.latencies)}  # --trace: ctl's.
    gs_env = {**os.environ, **service.env(), "PYTHONPATH": ROOT}
    local_env = {**os.environ, "PYTHONPATH": ROOT}

    def variant(system, storage):
        def run():
            command = COMMANDS[system](args.train_steps)
            name = f"{system}-{storage.replace('@', '')}-{len(seconds[system][storage])}"
            trace = os.path.join(scratch, f"{name}.trace") if args.trace and system == "ctl" else None
            if storage == "local":
                elapsed = run_once(command, os.path.join(scratch, name), local_env, trace)
            else:
                service.set_latency(int(storage[3:]))
                elapsed = run_once(command, f"gs://{service.bucket}/{name}-{uuid.uuid4().hex[:6]}",
                                   gs_env, trace)
            seconds[system][storage].append(elapsed)
            if trace:
                store_s[storage].append(training_thread_store_s(trace))
        return run

    try:
        for system in systems if args.warm else ():
            run_once(COMMANDS[system](args.train_steps), os.path.join(scratch, f"warm-{system}"),
                     local_env)
        measure.interleave({f"{system} {storage}": variant(system, storage)
                            for system in systems for storage in storages(args.latencies)},
                           args.rounds)
        sidecar = [sidecar_latency(service, max(args.latencies), args.checkpoints, interval)
                   for interval in (intervals if args.checkpoints else ())]
    finally:
        service.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    common = dict(rounds=args.rounds, train_steps=args.train_steps, started_utc=started_utc,
                  load_average_before=load_before, load_average_after=os.getloadavg())
    top = max(args.latencies)
    for system, line in ratios(seconds, args.latencies).items():
        per_round = {storage: times for storage, times in seconds[system].items()}
        target = {}
        if system == "ctl":
            ratio = line[f"gs@{top}_over_local"]
            target = dict(target=f"gs@{top}_over_local <= {RATIO_TARGET}", met=ratio <= RATIO_TARGET)
            if args.trace:
                target["training_thread_store_s"] = {storage: measure.median(values)
                                                     for storage, values in store_s.items()}
                target["training_thread_store_s_per_round"] = store_s
        measure.emit("object_store", system=system, **line, seconds_per_round=per_round,
                     **target, **common)
    for result in sidecar:
        measure.emit("object_store", system="ctl sidecar", latency_ms=top,
                     **{k: v for k, v in result.items() if k != "storage"},
                     target=f"median_s <= {SIDECAR_TARGET_S}",
                     met=result["median_s"] <= SIDECAR_TARGET_S)


if __name__ == "__main__":
    main()
