"""Ablation: what each piece of ctl's speed machinery is worth, on the MLP and the CNN.

    python -m bench.ablation [--rounds 25] [--workloads mlp,cnn] [--kinds train,eval] [--seed N]

In one process, per workload, ctl as `ctl.run` builds it (`loops.ctl_controller`)
against the same build with one piece taken out for the call, so that a
piece's ratio carries no difference between builds; two A/A lines say what
a ratio moves by itself: `ctl_b`, a second build of ctl unchanged (ctl's own
Trainer class), and `ctl_again`, ctl's own build timed under a second name.
Each piece is taken out from the bench's side, through ctl's public pieces:

- `end_in_place` (evaluation): each finished eval iterator ends on the
  caller's path (`ended_in_place`) instead of on ctl's ender thread
  (`end_off_path`, `ctl.core.loops`).
- `eager_summaries` (training): each loop's results written as it ends with
  `tf.summary.scalar` under the writer, which flushes (`EagerSummaries`, orbit's
  way with one flush a loop instead of orbit's one a value) instead of kept on
  the host and written every `SummaryManager.FLUSH_SECONDS` in one call.
- `separate_calls` (training): the graph train loop in three `tf.function`
  calls, metric reset, the loop, and a read of the metrics and the end step
  (`TogglingTrainer`, as orbit's `StandardTrainer` splits them) instead of one
  call that does all three. (ctl's line runs on that Trainer subclass too,
  its fused loop behind one more Python call; `ctl_b` on `ctl.Trainer`.)

Train variants run `loops * 100` steps a round (cnn: a fifth), eval variants
`loops` evaluations of 100 batches (cnn: a fifth), in each of `--instances`
builds, interleaved as figures 1 and 2 are (`measure.build_balanced`,
`measure.interleave`, places drawn from `order_seed`). One JSON line per
variant: `ratio_to_ctl` is ctl's median time over the variant's (speed without
the piece over speed with it: below 1, the piece pays), also in CPU time; a
piece's line also carries that process's A/A ratios (`aa_ratio_to_ctl`,
`same_build_aa_ratio_to_ctl`). A piece earns its place where its ratio lies
beyond the A/A spread over processes (`python -m bench.run --repeat 3 --only
ablation`) on at least one workload.
"""

import argparse
import contextlib
import dataclasses
import functools
import sys

import orbit
import tensorflow as tf

import ctl
from bench import loops, measure
from bench.workloads import BenchTask
from ctl.core import loops as core_loops
from ctl.core.summaries import SummaryManager

STEPS_PER_LOOP = 100

PIECES = {  # variant -> (the piece it takes out, the comparison it is in)
    "end_in_place": ("eval iterators ended off the path (ender thread)", "eval"),
    "eager_summaries": ("train summaries kept on the host, written every 5 s in one call", "train"),
    "separate_calls": ("metric reset, loop and read (with the end step) in one call", "train"),
}


class TogglingTrainer(ctl.Trainer):
    """ctl's Trainer whose graph train loop runs, while `separate_calls` is set, in three calls:
    reset; the loop; a read of the metrics and the end step (what ctl fuses into one)."""

    separate_calls = False

    def create_train_loop_fn(self):
        fused = super().create_train_loop_fn()
        guard = self.step_guard
        loop = tf.function((guard.graph_loop if guard else orbit.utils.create_tf_while_loop_fn)(
            self.train_step))
        reset = tf.function(self._reset_train_metrics)
        read = tf.function(lambda: (self._train_results(), self._loop_end_values()))
        self.three_calls = (reset, loop, read)  # (What tests/test_bench.py sees traced.)

        def three_calls(iterator, num_steps):
            reset()
            loop(iterator, num_steps)
            self._last_train.logs, end = read()
            return end

        return lambda iterator, num_steps: (three_calls if self.separate_calls else fused)(
            iterator, num_steps)


class EagerSummaries(SummaryManager):
    """Each loop's results written as the loop ends: `tf.summary.scalar` per value under the
    writer, whose exit flushes it (orbit's SummaryManager flushes after every value)."""

    def write_summaries(self, summary_dict, step=None):
        if not self.enabled:
            return
        with self.summary_writer().as_default():
            for name, value in summary_dict.items():
                tf.summary.scalar(name, value, step=step)


@contextlib.contextmanager
def ended_in_place():
    """In the block, ctl ends each finished eval iterator where it drops it (on the caller's
    path): every ctl module's `end_off_path` is a no-op, whichever module the Trainer's
    evaluation calls it from."""
    ender = core_loops.end_off_path
    modules = [module for name, module in list(sys.modules.items())
               if name.startswith("ctl.") and getattr(module, "end_off_path", None) is ender]
    for module in modules:
        module.end_off_path = _drop
    try:
        yield
    finally:
        for module in modules:
            module.end_off_path = ender


def _drop(iterator) -> None:
    """The caller's reference is the last one: its `del` ends the iterator in place."""


@contextlib.contextmanager
def _swapped(owner, name, value):
    kept = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, kept)


def train_variants(workload: str):
    """name -> builder of {variant: `run(steps)`}: a warmed-up ctl train loop (`ctl`, and
    `ctl_again`, the same callable), and the same build without each piece; `ctl_b`: a
    second build of ctl (ctl's own Trainer class)."""

    def build(trainer_cls=TogglingTrainer):
        _, controller = loops.ctl_controller(BenchTask(workload), steps_per_loop=STEPS_PER_LOOP,
                                             trainer_cls=trainer_cls)
        run = loops.drive(controller, STEPS_PER_LOOP)
        run.controller = controller
        if trainer_cls is not TogglingTrainer:
            return {"ctl_b": run}
        eager = EagerSummaries(controller.summary_manager.summary_dir, controller.global_step)

        def without(name, value, owner=controller):
            def run_without(steps):
                with _swapped(owner, name, value):
                    run(steps)
            run_without.controller = controller
            return run_without

        pieces = {"eager_summaries": without(
                      "summaries", dataclasses.replace(controller.summaries, train=eager)),
                  "separate_calls": without("separate_calls", True, controller.trainer)}
        for warm_up in pieces.values():  # Traces the three calls, makes the eager writer.
            warm_up(STEPS_PER_LOOP)
        return {"ctl": run, "ctl_again": run, **pieces}

    return {"ctl": build, "ctl_b": functools.partial(build, trainer_cls=ctl.Trainer)}


def eval_variants(workload: str):
    """name -> builder of {variant: `evaluate(steps)`}: `Controller.evaluate` (`ctl`, `ctl_again`)
    and the same build without each piece; `ctl_b`: a second build of ctl."""

    def build(pieces=True):
        _, controller = loops.ctl_controller(BenchTask(workload), mode="eval")

        def evaluate(steps):
            return controller.evaluate(steps=steps)

        evaluate(10)
        evaluate.controller = controller
        if not pieces:
            return {"ctl_b": evaluate}

        def end_in_place(steps):
            with ended_in_place():
                return controller.evaluate(steps=steps)

        end_in_place.controller = controller
        return {"ctl": evaluate, "ctl_again": evaluate, "end_in_place": end_in_place}

    return {"ctl": build, "ctl_b": functools.partial(build, pieces=False)}


def compare(kind: str, workload: str, builders, calls: int, args, seed: int) -> None:
    built = measure.build_balanced(builders, args.instances, seed)
    runs = {}  # variant -> its callable in each build
    for builds in built.values():
        for variants in builds:
            for name, run in variants.items():
                runs.setdefault(name, []).append(run)

    def each(instances):
        return lambda: [run(STEPS_PER_LOOP) for run in instances for _ in range(calls)]

    cpu = {}
    times = measure.interleave({name: each(r) for name, r in runs.items()}, args.rounds,
                               cpu=cpu, seed=seed)
    steps = calls * STEPS_PER_LOOP * args.instances
    aa = {"aa_ratio_to_ctl": measure.ratio(times["ctl"], times["ctl_b"]),
          "same_build_aa_ratio_to_ctl": measure.ratio(times["ctl"], times["ctl_again"])}
    for name in times:
        line = dict(kind=kind, variant=name, workload=workload,
                    steps_per_sec=steps / measure.median(times[name]),
                    ratio_to_ctl=measure.ratio(times["ctl"], times[name]),
                    cpu_ratio_to_ctl=measure.ratio(cpu["ctl"], cpu[name]))
        if name in PIECES:
            line.update(piece=PIECES[name][0], **aa)
        measure.emit("ablation", **line, rounds=args.rounds, instances=args.instances,
                     calls_per_round=calls, order_seed=seed)


def main():
    parser = argparse.ArgumentParser()
    measure.add_balanced_flags(parser, rounds=25)
    parser.add_argument("--loops", type=int, default=5,
                        help="train loops and evaluations per round and build (mlp); cnn: a fifth")
    parser.add_argument("--kinds", default="train,eval")
    args, seed = measure.start(parser)
    variants = {"train": train_variants, "eval": eval_variants}
    for workload in args.workloads.split(","):
        calls = args.loops if workload == "mlp" else max(1, args.loops // 5)
        for kind in args.kinds.split(","):
            compare(kind, workload, variants[kind](workload), calls, args, seed)


if __name__ == "__main__":
    main()
