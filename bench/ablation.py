"""Ablation: what each piece of ctl's speed machinery is worth, on the MLP and the CNN.

    python -m bench.ablation [--rounds 25] [--workloads mlp,cnn] [--seed N]

In one process, per workload, ctl as `ctl.run` builds it (`loops.ctl_controller`)
against ctl with one piece taken out, and `ctl_b`, a second build of ctl
unchanged: the A/A line, how far apart two builds of one thing land here.
Each piece is taken out from the bench's side, through ctl's public pieces:

- `end_in_place` (evaluation): each finished eval iterator ends on the
  caller's path (`ended_in_place`) instead of on ctl's ender thread
  (`end_off_path` in `ctl.core.trainer`).
- `write_after` (evaluation): the results written after the loop, eagerly
  (`WritesAfterTrainer`: a Trainer whose `evaluate` takes no `summaries`, so
  the Controller writes its results under `SummaryManager.writing()`: the
  kept rows and one flush) instead of in the loop's own call.
- `eager_summaries` (training): each loop's results written as it ends with
  `tf.summary.scalar` under the writer, which flushes (`EagerSummaries`, orbit's
  way with one flush a loop instead of orbit's one a value) instead of kept on
  the host and written every `SummaryManager.FLUSH_SECONDS` in one call.
- `separate_calls` (training): the graph train loop in three `tf.function`
  calls, metric reset, the loop, and a read of the metrics and the end step
  (`SeparateCallsTrainer`, as orbit's `StandardTrainer` splits them) instead of
  one call that does all three.

Train variants run `loops * 100` steps a round (cnn: a fifth), eval variants
`evals` evaluations of 100 batches (cnn: a fifth), each variant in `--instances`
builds, interleaved as figures 1 and 2 are (`measure.build_balanced`,
`measure.interleave`, places drawn from `order_seed`). One JSON line per
variant: `ratio_to_ctl` is ctl's median time over the variant's (speed without
the piece over speed with it: below 1, the piece pays), also in CPU time; a
piece's line also carries that process's A/A ratio (`aa_ratio_to_ctl`). A piece
earns its place where its ratio lies beyond the A/A spread over processes
(`python -m bench.run --repeat 3 --only ablation`) on at least one workload.
"""

import argparse
import contextlib
import functools
import sys

import orbit
import tensorflow as tf

import ctl
from bench import loops, measure
from bench.workloads import BenchTask
from ctl.core import trainer as trainer_module
from ctl.core.summaries import SummaryManager

STEPS_PER_LOOP = 100

PIECES = {  # variant -> (the piece it takes out, the comparison it is in)
    "end_in_place": ("eval iterators ended off the path (ender thread)", "eval"),
    "write_after": ("eval results written in the loop's own call", "eval"),
    "eager_summaries": ("train summaries kept on the host, written every 5 s in one call", "train"),
    "separate_calls": ("metric reset, loop and read (with the end step) in one call", "train"),
}


class SeparateCallsTrainer(ctl.Trainer):
    """ctl's Trainer with its graph train loop in three calls: reset; loop; read the metrics
    and the end step (what `ctl.Trainer.create_train_loop_fn` fuses into one)."""

    def create_train_loop_fn(self):
        guard = self.step_guard
        loop = tf.function((guard.graph_loop if guard else orbit.utils.create_tf_while_loop_fn)(
            self.train_step))
        reset = tf.function(self._reset_train_metrics)
        read = tf.function(lambda: (self._train_results(), self._loop_end_values()))

        def three_calls(iterator, num_steps):
            reset()
            loop(iterator, num_steps)
            self._last.train, end = read()
            return end

        return three_calls


class WritesAfterTrainer(ctl.Trainer):
    """ctl's Trainer whose `evaluate` takes no `summaries`: the Controller writes the results
    after the loop (`SummaryManager.writing()`), as for any other orbit evaluator."""

    def evaluate(self, num_steps, batch_callbacks=()):
        return super().evaluate(num_steps, batch_callbacks)


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
    ender = trainer_module.end_off_path
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


def train_variants(workload: str):
    """name -> builder of `run(steps)`, a warmed-up ctl train loop with or without a piece."""

    def build(trainer_cls=None, summaries=None):
        _, controller = loops.ctl_controller(BenchTask(workload), steps_per_loop=STEPS_PER_LOOP,
                                             trainer_cls=trainer_cls)
        if summaries is not None:  # The same directory, written another way.
            controller.summary_manager = summaries(controller.summary_manager.summary_dir,
                                                   controller.global_step)
        run = loops.drive(controller, STEPS_PER_LOOP)
        run.controller = controller
        return run

    return {"ctl": build, "ctl_b": build,
            "eager_summaries": functools.partial(build, summaries=EagerSummaries),
            "separate_calls": functools.partial(build, trainer_cls=SeparateCallsTrainer)}


def eval_variants(workload: str):
    """name -> builder of `evaluate(steps)`: `Controller.evaluate` with or without a piece."""

    def build(trainer_cls=None, in_place=False):
        _, controller = loops.ctl_controller(BenchTask(workload), mode="eval",
                                             trainer_cls=trainer_cls)

        def evaluate(steps):
            with ended_in_place() if in_place else contextlib.nullcontext():
                return controller.evaluate(steps=steps)

        evaluate(10)
        evaluate.controller = controller
        return evaluate

    return {"ctl": build, "ctl_b": build,
            "end_in_place": functools.partial(build, in_place=True),
            "write_after": functools.partial(build, trainer_cls=WritesAfterTrainer)}


def compare(kind: str, workload: str, builders, calls: int, args, seed: int) -> None:
    runs = measure.build_balanced(builders, args.instances, seed)

    def each(instances):
        return lambda: [run(STEPS_PER_LOOP) for run in instances for _ in range(calls)]

    cpu = {}
    times = measure.interleave({name: each(r) for name, r in runs.items()}, args.rounds,
                               cpu=cpu, seed=seed)
    steps = calls * STEPS_PER_LOOP * args.instances
    aa = measure.ratio(times["ctl"], times["ctl_b"])
    for name in times:
        line = dict(kind=kind, variant=name, workload=workload,
                    steps_per_sec=steps / measure.median(times[name]),
                    ratio_to_ctl=measure.ratio(times["ctl"], times[name]),
                    cpu_ratio_to_ctl=measure.ratio(cpu["ctl"], cpu[name]))
        if name in PIECES:
            line.update(piece=PIECES[name][0], aa_ratio_to_ctl=aa)
        measure.emit("ablation", **line, rounds=args.rounds, instances=args.instances,
                     calls_per_round=calls, order_seed=seed)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--loops", type=int, default=5,
                        help="train loops and evaluations per round and build (mlp); cnn: a fifth")
    parser.add_argument("--workloads", default="mlp,cnn")
    parser.add_argument("--kinds", default="train,eval")
    parser.add_argument("--instances", type=int, default=2,
                        help="builds of each variant, in balanced order (measure.build_balanced)")
    measure.add_seed_flag(parser)
    args = parser.parse_args()
    seed = measure.draw_seed(args.seed)
    measure.claim_stdout()
    variants = {"train": train_variants, "eval": eval_variants}
    for workload in args.workloads.split(","):
        calls = args.loops if workload == "mlp" else max(1, args.loops // 5)
        for kind in args.kinds.split(","):
            compare(kind, workload, variants[kind](workload), calls, args, seed)


if __name__ == "__main__":
    main()
