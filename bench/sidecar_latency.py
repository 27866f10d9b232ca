"""Sidecar latency: from a checkpoint's commit to the start of its evaluation.

    PYTHONPATH=. python bench/sidecar_latency.py [--checkpoints 30] [--interval 0.5] [--model_dir DIR]

Starts `python -m ctl.run --mode=continuous_eval` at default settings on an
empty model dir, waits until it watches, then writes checkpoints as ctl's
trainer does (`ctl.core.checkpointing.CheckpointManager` over global step, model
and optimizer of the regression task in tests/tasks.py), one every
`interval` seconds. A checkpoint is committed when the `checkpoint` state
file names it, just after its index file is written; the latency is timed
from the index file's mtime (an upper bound: the state file is written twice
by `save()`, before and after deleting old checkpoints, so its mtime is not
the commit). The evaluator records when it starts
each evaluation (`started` in eval/metrics.jsonl). Both run on this host, so
their clocks agree. Prints one JSON object: median, p90 and max latency in
seconds, and each checkpoint's.

`--model_dir gs://BUCKET/DIR` (in an env from `python -m tests.gcs`) measures on
an object store: there ctl's manager saves to a local staging dir and uploads
the files, then the state file naming the checkpoint; after each save the
writer waits for that (`sync()`), and the commit is the state file's
object time (the store's clock, this host's in the test GCS API). Bench
figure 9 (bench/object_store.py) runs it that way at 50 ms a request.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import tensorflow as tf  # noqa: E402

from ctl.core.checkpointing import CheckpointManager  # noqa: E402
from ctl.model_dir import ModelDir, is_object_store  # noqa: E402
from tests.tasks import RegressionTask  # noqa: E402

GIN = os.path.join(ROOT, "tests", "regression.gin")


def wait_for(condition, what, timeout):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"sidecar_latency: timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def write_checkpoints(model_dir, count, interval):
    """Saves `count` checkpoints, steps 1..count; returns {number: commit time}."""
    remote = is_object_store(model_dir)
    task = RegressionTask()
    model, optimizer = task.build_model(), task.build_optimizer()
    optimizer.build(model.trainable_variables)
    step = tf.Variable(0, dtype=tf.int64)
    manager = CheckpointManager(
        tf.train.Checkpoint(global_step=step, model=model, optimizer=optimizer), ModelDir(model_dir),
        step_counter=step, max_to_keep=5)
    committed = {}
    for number in range(1, count + 1):
        step.assign(number)
        model.trainable_variables[1].assign_add([0.01])  # New values each time.
        path = manager.save(check_interval=False)
        if remote:  # Uploaded: data, index, then the state file naming it (the commit).
            manager.sync()
            state = tf.io.gfile.stat(os.path.join(model_dir, "checkpoint"))
            committed[number] = state.mtime_nsec / 1e9
        else:
            # The index file is written last of the checkpoint's files, just before the
            # state file names it: timing from it slightly overstates the latency.
            committed[number] = os.stat(path + ".index").st_mtime_ns / 1e9
        time.sleep(interval)
    manager.close()
    ModelDir(model_dir).mark_finished(count, manager.latest_checkpoint)
    return committed


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoints", type=int, default=30)
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--model_dir", default=None,
                        help="an empty dir, e.g. gs://BUCKET/DIR (default: a new local temporary dir)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch, \
            tempfile.TemporaryFile("w+") as log:
        model_dir = args.model_dir or scratch
        evaluator = subprocess.Popen(
            [sys.executable, "-m", "ctl.run", "--mode=continuous_eval",
             f"--model_dir={model_dir}", f"--gin_file={GIN}"],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "PYTHONPATH": ROOT})
        try:
            def watching():
                log.seek(0)
                return "waiting for a new checkpoint" in log.read()

            wait_for(watching, "the evaluator to start watching", args.timeout)
            committed = write_checkpoints(model_dir, args.checkpoints, args.interval)
            evaluator.wait(timeout=args.timeout)
        finally:
            if evaluator.poll() is None:
                evaluator.kill()
                evaluator.wait()
        if evaluator.returncode != 0:
            log.seek(0)
            raise SystemExit(f"sidecar_latency: evaluator failed:\n{log.read()[-3000:]}")
        records = ModelDir(model_dir).sidecar_evaluations()
    latency = {r["number"]: r["started"] - committed[r["number"]] for r in records}
    values = sorted(latency.values())
    print(json.dumps({
        "storage": "object store" if is_object_store(model_dir) else "local",
        "checkpoints": args.checkpoints,
        "evaluated": len(values),
        "interval_s": args.interval,
        "median_s": round(statistics.median(values), 4),
        "p90_s": round(values[int(0.9 * (len(values) - 1))], 4),
        "max_s": round(values[-1], 4),
        "per_checkpoint_s": {n: round(v, 4) for n, v in sorted(latency.items())},
    }))


if __name__ == "__main__":
    main()
