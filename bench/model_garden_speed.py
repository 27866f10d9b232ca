"""Figure 13: ctl against Model Garden's `train_lib` on Model Garden's own experiments, interleaved.

    python -m bench.model_garden_speed [--experiments=NAME,NAME] [--steps_per_loop=10]
        [--loops=3] [--rounds=6] [--workdir=DIR]

For each experiment (default: `image_classification`, `retinanet_resnetfpn_coco`,
`bert/sentence_prediction`: a classification, a detection and an NLP one), in a
process of its own, the zoo's tiny variant (`bench.model_garden_zoo.variants`) on
its generated files (`bench.model_garden_zoo.data`) is built three times from
one initial checkpoint:

- `ctl`: `ctl.ModelGardenTask` under ctl's Trainer and Controller, as `ctl.run`
  builds them (`ctl.train_lib.build_controller`, via `bench.loops.ctl_controller`);
- `train_lib`: Model Garden's own `official.core.train_lib.OrbitExperimentRunner`
  (what `train_lib.run_experiment` runs) on the same experiment config: its
  trainer, checkpoint manager, actions and orbit Controller;
- `train_lib_b`: a second, separate build of `train_lib`: the A/A arm, how far
  apart two builds of one trainer land in this process.

Each arm's controller trains to its next step in loops of `steps_per_loop`
(a summary every loop, as both write them; no checkpoint on the way), so its
train loop and everything either framework does between loops (summaries, the
checkpoint check, the console and its lines, actions) are timed. The first call of
each arm (one loop: it traces) is untimed. Then `--rounds` rounds, each arm
training `--loops` loops per round, in balanced orders (`measure.interleave`).

Per experiment one JSON line per arm (`steps_per_sec`, its CPU-time rate) and a
line with `ctl_over_train_lib`: the median over rounds of ctl's steps/s over
train_lib's in the same round (above 1: ctl faster), with `aa`, the same ratio of
`train_lib_b` over `train_lib`, and both per round: ctl is at least as fast when
the ratio is at least 1, and is not slower beyond the spread of two identical arms
when it is at least the A/A line's lowest round (`within_aa`).
"""

import argparse
import functools
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List

from bench import measure

EXPERIMENTS = ("image_classification", "retinanet_resnetfpn_coco", "bert/sentence_prediction")
ARMS = ("ctl", "train_lib", "train_lib_b")
FIGURE = "model_garden_speed"
TRAIN_STEPS = 1_000_000  # No arm reaches it; the learning-rate schedules decay over it.


def overrides_for(experiment: str, steps_per_loop: int, data_dir: str) -> List[Dict[str, Any]]:
    """The zoo's tiny variant of `experiment` on its generated data, trained in loops of
    `steps_per_loop` with a summary each loop and no checkpoint or evaluation on the way."""
    from bench.model_garden_zoo import data, variants

    schedule = {"trainer": {"train_steps": TRAIN_STEPS, "steps_per_loop": steps_per_loop,
                            "summary_interval": steps_per_loop,
                            "checkpoint_interval": TRAIN_STEPS, "validation_interval": TRAIN_STEPS}}
    return (variants.overrides(experiment, TRAIN_STEPS) + data.data_overrides(experiment, data_dir)
            + [schedule])


def ctl_arm(experiment: str, overrides, model_dir: str, steps_per_loop: int) -> Any:
    """`run(num_steps)` for ctl: `ctl.ModelGardenTask` under the Controller `ctl.run` builds."""
    import ctl
    from bench import loops

    task = ctl.ModelGardenTask(experiment=experiment, params_override=overrides,
                               logging_dir=model_dir)
    _, controller = loops.ctl_controller(task, model_dir=model_dir, steps_per_loop=steps_per_loop)
    return loops.drive(controller, steps_per_loop)


def train_lib_arm(experiment: str, overrides, model_dir: str, steps_per_loop: int) -> Any:
    """`run(num_steps)` for Model Garden: the orbit Controller of `train_lib.OrbitExperimentRunner`."""
    import tensorflow as tf
    from official.core import train_lib

    from bench import loops
    from ctl.adapters import model_garden

    params = model_garden.experiment_config(experiment, params_override=overrides)
    task = model_garden.garden_task(params, logging_dir=model_dir)
    runner = train_lib.OrbitExperimentRunner(
        distribution_strategy=tf.distribute.get_strategy(), task=task, mode="train",
        params=params, model_dir=model_dir)
    return loops.drive(runner.controller, steps_per_loop)


def measure_experiment(experiment: str, workdir: str, steps_per_loop: int, loops: int,
                       rounds: int, seed: int) -> None:
    """Builds the arms of one experiment, times them interleaved and emits its lines."""
    import tensorflow as tf

    from bench.model_garden_zoo import compare, registry

    registry.import_all()
    name = experiment.replace("/", "_")
    overrides = overrides_for(experiment, steps_per_loop, os.path.join(workdir, "data"))
    dirs = {arm: tempfile.mkdtemp(prefix=f"{name}-{arm}-", dir=workdir) for arm in ARMS}
    compare.write_initial_checkpoint(experiment, overrides, list(dirs.values()))
    builders = {"ctl": ctl_arm, "train_lib": train_lib_arm, "train_lib_b": train_lib_arm}
    built, build_s = {}, {}
    for arm in measure.shuffled(ARMS, seed, "builds"):  # Each traces its loop in its first call.
        start = time.perf_counter()
        built[arm] = builders[arm](experiment, overrides, dirs[arm], steps_per_loop)
        build_s[arm] = time.perf_counter() - start
    steps = steps_per_loop * loops
    cpu: Dict[str, List[float]] = {}
    calls: Dict[str, Callable[[], None]] = {
        arm: functools.partial(built[arm], steps) for arm in ARMS}
    times = measure.interleave(calls, rounds, cpu=cpu, seed=seed)
    for arm in ARMS:
        measure.emit(FIGURE, experiment=experiment, variant=arm,
                     steps_per_sec=steps / measure.median(times[arm]),
                     cpu_steps_per_sec=steps / measure.median(cpu[arm]),
                     build_and_first_loop_s=build_s[arm],
                     per_round_s=[round(t, 3) for t in times[arm]],
                     global_step=int(built[arm].global_step.numpy()))
    ctl_rounds = [g / c for c, g in zip(times["ctl"], times["train_lib"])]
    aa_rounds = [g / b for b, g in zip(times["train_lib_b"], times["train_lib"])]
    ratio, aa = measure.median(ctl_rounds), measure.median(aa_rounds)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    measure.emit(FIGURE, experiment=experiment, ctl_over_train_lib=ratio,
                 ctl_over_train_lib_per_round=ctl_rounds, aa=aa, aa_per_round=aa_rounds,
                 aa_spread=[min(aa_rounds), max(aa_rounds)],
                 cpu_ctl_over_train_lib=measure.ratio(cpu["train_lib"], cpu["ctl"]),
                 cpu_aa=measure.ratio(cpu["train_lib"], cpu["train_lib_b"]),
                 steps_per_loop=steps_per_loop, loops_per_round=loops, rounds=rounds,
                 order_seed=seed, target="ctl_over_train_lib >= 1.0", met=ratio >= 1.0,
                 within_aa=ratio >= min(aa_rounds), tf_version=tf.__version__,
                 process_cpu_s=round(usage.ru_utime + usage.ru_stime, 1),
                 load_average=list(os.getloadavg()))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiments", default=",".join(EXPERIMENTS))
    parser.add_argument("--steps_per_loop", type=int, default=10)
    parser.add_argument("--loops", type=int, default=3, help="loops per arm per round")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--workdir", default=None, help="data and model dirs (default: a temp dir)")
    parser.add_argument("--seed", type=int, default=None, help="the arms' build and round orders")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # A child's run.
    args = parser.parse_args(argv)
    seed = measure.draw_seed(args.seed)
    workdir = args.workdir or tempfile.mkdtemp(prefix="ctl-mg-speed-")
    if args.one:
        measure.claim_stdout()
        measure_experiment(args.experiments, workdir, args.steps_per_loop, args.loops,
                           args.rounds, seed)
        return 0
    failed = 0
    for experiment in args.experiments.split(","):  # A process each: its own TensorFlow state.
        command = [sys.executable, "-m", "bench.model_garden_speed", "--one",
                   f"--experiments={experiment}", f"--steps_per_loop={args.steps_per_loop}",
                   f"--loops={args.loops}", f"--rounds={args.rounds}", f"--workdir={workdir}",
                   f"--seed={seed}"]
        result = subprocess.run(command, stdout=subprocess.PIPE, text=True)
        sys.stdout.write(result.stdout)
        sys.stdout.flush()
        if result.returncode != 0:
            failed += 1
            print(json.dumps({"figure": FIGURE, "experiment": experiment,
                              "error": f"exited {result.returncode} (its stderr above)"}), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
