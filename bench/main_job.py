"""Figure 8: the main job end to end, ctl against Model Garden's train_lib on the same work.

    python -m bench.main_job [--rounds 3]

Each round launches, interleaved (the order alternating), on fresh model dirs:
  ctl:  python -m ctl.run --mode=train_and_eval --gin_file=configs/digits.gin
  mg:   python bench/mg_digits.py   (Model Garden's Task and train_lib.run_experiment,
        the same model, data, optimizer and schedule: 2,000 steps, loops of
        100, an evaluation of the held-out set and a checkpoint every 500 steps)
and times each whole process, from `Popen` to exit (TensorFlow's import
included). `ctl_over_mg` is the median over rounds of ctl's time over mg's in
the same round (pair by pair, so a burst of load falls on both); target < 1.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

from bench import measure

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMANDS = {
    "ctl": [sys.executable, "-m", "ctl.run", "--mode=train_and_eval",
            "--gin_file=configs/digits.gin"],
    "mg": [sys.executable, "bench/mg_digits.py"],
}
TIMEOUT_S = 300


def run_once(command, model_dir, env=None, timeout=TIMEOUT_S):
    """Seconds the whole process takes; raises if it fails."""
    env = env or {**os.environ, "PYTHONPATH": ROOT}
    start = time.perf_counter()
    result = subprocess.run([*command, f"--model_dir={model_dir}"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            timeout=timeout)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(f"{command} on {model_dir} exited {result.returncode}: "
                           f"{result.stderr[-2000:]}")
    return elapsed


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    measure.claim_stdout()
    scratch = tempfile.mkdtemp(prefix="ctl-main-job-")
    seconds = {name: [] for name in COMMANDS}
    try:
        for name, command in COMMANDS.items():  # Warms file caches (imports), untimed.
            run_once(command, os.path.join(scratch, f"warm-{name}"))
        measure.interleave({
            name: (lambda name=name: seconds[name].append(run_once(
                COMMANDS[name], os.path.join(scratch, f"{name}{len(seconds[name])}"))))
            for name in COMMANDS}, args.rounds)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    pairs = [c / m for c, m in zip(seconds["ctl"], seconds["mg"])]
    ratio = measure.median(pairs)
    measure.emit("main_job", ctl_s=measure.median(seconds["ctl"]),
                 mg_s=measure.median(seconds["mg"]), ctl_over_mg=ratio,
                 ctl_over_mg_per_round=pairs, rounds=args.rounds,
                 target="ctl_over_mg < 1.0", met=ratio < 1.0)


if __name__ == "__main__":
    main()
