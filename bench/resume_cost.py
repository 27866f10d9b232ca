"""Figure 7: process start to the first train step when resuming at step 0, 100,000 and 10,000,000.

    python -m bench.resume_cost [--rounds 3] [--steps 0,100000,10000000]

Per pipeline (`digits`: configs/digits.gin; `map1ms`: bench/configs/resume_map.gin,
whose `map` costs about 1 ms per example), this process trains 20 steps into
a model dir, then writes from it one checkpoint per resume step: the same
model and input position (20 batches read) under `global_step` = that step.
Each round then launches, interleaved, `python -m ctl.run --mode=train` on a
fresh copy of each model dir (to step + 1, one step per loop) and times from
`Popen` to its "train | step: <step + 1>" line: TensorFlow's import, the
restore, finding the input position and the first step. With the position
in the checkpoint that time does not depend on the step; skipping to it
would take ~0.2 ms a batch for digits (20 s at step 100,000) and 64 ms a
batch for map1ms. `spread_s`, the largest difference between the steps'
medians, is the figure; target: within 1 s.
"""

import argparse
import os
import re
import shutil
import sys
import tempfile
import time

import gin
import tensorflow as tf

from bench import measure
from bench.startup import time_to_line
from ctl import train_lib
from ctl.config import gin_config as config
from ctl.experiment import Experiment
from ctl.core.stop import SignalWatcher
from ctl.model_dir import ModelDir
from ctl.cluster.run_plan import RunPlan

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PIPELINES = {"digits": "configs/digits.gin", "map1ms": "bench/configs/resume_map.gin"}
TARGET_S = 1.0
TRAINED = 20  # Steps trained for real: the saved position.


def prepare(gin_file, steps, scratch):
    """One model dir per resume step: the model and input position after TRAINED steps."""
    gin.clear_config()
    config.parse([os.path.join(ROOT, gin_file)],
                 [f"ctl.Schedule.train_steps = {TRAINED}", "ctl.Schedule.checkpoint_interval = 500",
                  "ctl.Schedule.eval_interval = None"])
    experiment = config.call_configured(Experiment)
    source = os.path.join(scratch, "trained")
    train_lib.run_experiment("train", source, experiment=experiment)
    dirs = {}
    for step in steps:
        model_dir = os.path.join(scratch, f"step{step}")
        with SignalWatcher() as watcher:
            built = train_lib.build_controller(RunPlan("train"), ModelDir(source), tf.distribute.get_strategy(),
                                               experiment, checkpoint_dir=ModelDir(model_dir),
                                               watcher=watcher)
        how = built.faults.resume_inputs()
        assert how == "checkpoint", how
        built.trainer.global_step.assign(step)
        built.controller.save_checkpoint()
        for name in ("config.gin", "operative_config.gin"):
            if os.path.exists(os.path.join(source, name)):
                shutil.copy(os.path.join(source, name), model_dir)
        dirs[step] = model_dir
    return dirs, experiment.task


def map_ms_per_example(task):
    """What the pipeline's map costs per example, one at a time (ms)."""
    expensive = getattr(task, "expensive", None)
    if expensive is None:
        return 0.0
    data = tf.data.Dataset.from_tensors((tf.zeros(64), tf.constant(0))).repeat(300)
    iterator = iter(data.map(expensive))
    next(iterator)
    start = time.perf_counter()
    count = sum(1 for _ in iterator)
    return (time.perf_counter() - start) / count * 1000


def resume_once(gin_file, model_dir, step, scratch, runs):
    fresh = os.path.join(scratch, f"run{len(runs)}")
    shutil.copytree(model_dir, fresh)
    runs.append(fresh)
    line = re.compile(rf"^train \| step:\s+{step + 1}(/\d+)? \|")
    try:
        return time_to_line(
            [sys.executable, "-m", "ctl.run", "--mode=train", f"--model_dir={fresh}",
             f"--gin_file={gin_file}", f"--gin_bindings=ctl.Schedule.train_steps={step + 1}",
             "--gin_bindings=ctl.Schedule.steps_per_loop=1",
             "--gin_bindings=ctl.Schedule.eval_interval=None"], line, timeout=600)
    finally:
        shutil.rmtree(fresh, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", default="0,100000,10000000")
    parser.add_argument("--pipelines", default=",".join(PIPELINES))
    args = parser.parse_args()
    measure.claim_stdout()
    steps = [int(s) for s in args.steps.split(",")]
    for name in args.pipelines.split(","):
        gin_file = PIPELINES[name]
        scratch = tempfile.mkdtemp(prefix=f"ctl-resume-{name}-")
        runs = []
        try:
            dirs, task = prepare(gin_file, steps, scratch)
            resume_once(gin_file, dirs[steps[0]], steps[0], scratch, runs)  # Warms file caches.
            seconds = {step: [] for step in steps}
            measure.interleave({
                str(step): (lambda step=step: seconds[step].append(
                    resume_once(gin_file, dirs[step], step, scratch, runs)))
                for step in steps}, args.rounds)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        medians = {step: measure.median(values) for step, values in seconds.items()}
        spread = max(medians.values()) - min(medians.values())
        measure.emit("resume_cost", pipeline=name,
                     map_ms_per_example=map_ms_per_example(task),
                     seconds_to_first_step={str(s): m for s, m in medians.items()},
                     spread_s=spread, rounds=args.rounds,
                     target=f"spread_s <= {TARGET_S}", met=spread <= TARGET_S)


if __name__ == "__main__":
    main()
