"""Every object-store request of the main job, and which ones the training thread waits for.

    python -m bench.store_requests [--latency_ms=50] [--train_steps=2000] [--out=FILE]

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


def _child(calls_path: str, argv) -> None:
    import runpy

    import tensorflow as tf

    records = []
    lock = threading.Lock()

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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency_ms", type=int, default=50)
    parser.add_argument("--train_steps", type=int, default=2000)
    parser.add_argument("--out", default="")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args(argv)
    if args.child:
        _child(args.child, rest)
        return 0
    sys.path.insert(0, ROOT)
    from tests.gcs.service import GcsService

    scratch = tempfile.mkdtemp(prefix="ctl-store-requests-")
    requests_log = os.path.join(scratch, "requests.jsonl")
    calls_log = os.path.join(scratch, "calls.jsonl")
    service = GcsService(latency_ms=args.latency_ms)
    try:
        service.log_requests(requests_log)
        model_dir = f"gs://{service.bucket}/main-{uuid.uuid4().hex[:6]}"
        command = [sys.executable, "-m", "bench.store_requests", f"--child={calls_log}",
                   "--mode=train_and_eval", "--gin_file=configs/digits.gin",
                   f"--gin.TRAIN_STEPS={args.train_steps}", f"--model_dir={model_dir}"]
        launched = time.time()
        done = subprocess.run(command, cwd=ROOT, env={**os.environ, **service.env(),
                                                      "PYTHONPATH": ROOT},
                              capture_output=True, text=True, check=False, timeout=1800)
        seconds = time.time() - launched
        if done.returncode:
            raise SystemExit(f"the main job failed: {done.stderr[-3000:]}")
    finally:
        service.stop()
    with open(requests_log) as f:
        requests = [json.loads(line) for line in f]
    with open(calls_log) as f:
        calls = sorted((json.loads(line) for line in f), key=lambda c: c["start"])
    lines = []
    main_calls = [c for c in calls if c["thread"] == "MainThread"]
    for c in main_calls:
        during = [r for r in requests if c["start"] <= r["start"] <= c["end"]]
        lines.append(f"+{c['start'] - launched:7.3f}s {c['end'] - c['start']:6.3f}s "
                     f"{len(during):2d} req  {c['call']:<12} {c['path'].split('/', 3)[-1]:<40} "
                     f"<- {c['caller']}")
    in_main = sum(1 for r in requests if any(c["start"] <= r["start"] <= c["end"]
                                            for c in main_calls))
    summary = {"figure": "store_requests", "latency_ms": args.latency_ms,
               "train_steps": args.train_steps, "seconds": round(seconds, 2),
               "main_thread_store_s": round(sum(c["end"] - c["start"] for c in main_calls), 2),
               "main_thread_calls": len(main_calls), "requests": len(requests),
               "requests_during_main_thread_calls": in_main,
               "calls_by_thread": {t: sum(1 for c in calls if c["thread"] == t)
                                   for t in sorted({c["thread"] for c in calls})},
               "load_average": round(os.getloadavg()[0], 2)}
    print("\n".join(lines))
    print(json.dumps(summary))
    if args.out:
        with open(args.out, "w") as out:
            out.write("\n".join(lines) + "\n" + json.dumps(summary) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
