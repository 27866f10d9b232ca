"""Figure 5: time from launching `python -m ctl.run --mode=train` to its first completed step.

    python -m bench.startup [--rounds 5]

Each round launches, interleaved, `python -m ctl.run --mode=train` with
`bench/configs/startup.gin` (one step of the bench MLP, a fresh model dir) and
`python bench/bare_step.py` (TensorFlow, Keras, the same model, one
`tf.function` step), and times from `Popen` to the line that reports the first
completed step on stdout (ctl's "train | step:      1/1 |", "bare | step: 1").
Both run unbuffered; the rest of ctl's run (the final checkpoint, exit) is
not counted.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from bench import measure

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET_S = 1.5
CTL_STEP = re.compile(r"^train \| step:\s+1(/\d+)? \|")  # "step: N/total" or "step: N"
BARE_STEP = re.compile(r"^bare \| step: 1 ")


def time_to_line(command, pattern, timeout=120.0):
    """Seconds from launch to the first stdout line matching `pattern`."""
    env = {**os.environ, "PYTHONPATH": ROOT, "PYTHONUNBUFFERED": "1"}
    start = time.perf_counter()
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True)
    try:
        elapsed = None
        for line in process.stdout:
            if elapsed is None and pattern.search(line):
                elapsed = time.perf_counter() - start
            if time.perf_counter() - start > timeout:
                break
        process.wait(timeout=timeout)
        if elapsed is None or process.returncode != 0:
            raise RuntimeError(f"{command} exited {process.returncode} before its first step")
        return elapsed
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    measure.claim_stdout()
    scratch = tempfile.mkdtemp(prefix="ctl-startup-")
    runs = []

    def ctl_run():
        model_dir = os.path.join(scratch, f"run{len(runs)}")
        runs.append(model_dir)
        return time_to_line(
            [sys.executable, "-m", "ctl.run", "--mode=train", f"--model_dir={model_dir}",
             "--gin_file=bench/configs/startup.gin"], CTL_STEP)

    def bare():
        return time_to_line([sys.executable, "bench/bare_step.py"], BARE_STEP)

    try:
        seconds = {"ctl": [], "bare": []}
        measure.interleave({
            "ctl": lambda: seconds["ctl"].append(ctl_run()),
            "bare": lambda: seconds["bare"].append(bare()),
        }, args.rounds)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    extra = measure.difference(seconds["ctl"], seconds["bare"])
    measure.emit("startup", ctl_s=measure.median(seconds["ctl"]),
                 bare_s=measure.median(seconds["bare"]), ctl_extra_s=extra,
                 rounds=args.rounds, target=f"ctl_extra_s <= {TARGET_S}", met=extra <= TARGET_S)


if __name__ == "__main__":
    main()
