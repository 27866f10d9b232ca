"""Figures 3 and 4: what checkpoints and evaluations cost the training loop.

    python -m bench.controller_cost [--rounds 5]

Figure 3 (`controller_cost`): ctl trains `train_steps` steps per round on the
mlp workload (30,000: three checkpoints and evaluations a round, so that a
round's time is long against its noise), in loops of 100, three ways,
interleaved:
  alone        `Controller.train`, no checkpoint, no evaluation;
  sync / async `Controller.train_and_evaluate` with a checkpoint and an
               evaluation of `eval_steps` batches every `interval` steps,
               checkpoints written synchronously or in the background.
The three controllers drive one and the same trainer (model, optimizer,
iterator, traced loops; built as `ctl.run` builds it), each with its own
checkpoint manager and directory: the variants differ in what happens at the
intervals and in nothing else. (Three trainers, one a variant, ran several %
apart whatever they did: sync came out 8% *faster* than training alone.)
The cost is the ratio of the median time to that of training alone, minus
one (`cpu_cost_without_eval`: the same in CPU time of the process, which other
processes' load disturbs less). It includes the evaluations' own compute: `eval_share` estimates that
share (eval steps' time over train steps' time, measured here) so that what
remains is the controller's; `overhead_per_interval_s` is that remainder in
seconds per checkpoint-and-evaluation. `save_blocks_share` is measured
directly, not as a difference: the median time a `save()` call blocks
training, times the saves per round, over training alone (for async saves the
background write's competition for the CPU is only in `cost`).
`paired_cost_without_eval` is the same cost as the median of each round's
ratio (a variant's time over training alone's in the same round, measured
one after the other), which cancels a drift of the loops' speed slower than
a round.
`direct_cost_without_eval` is measured within each round, free of the drift of
the loops' speed from round to round (a few % here): the time outside the
train loops (`trainer.train` calls) over the time inside them, minus the same
for training alone, minus `eval_share`. `loops_slowdown` is the time inside
the loops over training alone's, minus one: what a background write (or
noise) takes from the loops themselves.

Figure 4 (`checkpoint_stall`): on the `wide` workload (52 MB checkpoints) ctl
trains `saves` loops of 20 steps per round with no checkpoint, a synchronous
one after every loop, or an asynchronous one. The stall (`sync_stall_s`,
`async_stall_s`) is how long the checkpoint manager's `save` call blocks the
training loop (median over saves); `async_over_sync` is their ratio. The
background write is not free: `*_extra_train_s` is the extra median wall time
per checkpoint of the whole run over no checkpoint (the wait for the last
async write at the end of `train` and the slowdown of training while the
writer thread competes for the CPU included), `cpu_*_s` the extra CPU time of
the process per checkpoint.
"""

import argparse
import time

from bench import loops, measure
from bench.workloads import BenchTask

COST_TARGET = 0.03
STALL_TARGET = 0.10


def controller_cost(args):
    interval, train_steps = args.interval, args.train_steps
    _, alone = loops.ctl_controller(BenchTask("mlp"), mode="train_and_eval", steps_per_loop=100)
    with_sync = loops.sibling_controller(alone, checkpoint_interval=interval)
    with_async = loops.sibling_controller(alone, checkpoint_interval=interval,
                                          async_checkpointing=True)

    def train_alone(steps):
        alone.train(alone.refresh_step() + steps, checkpoint_at_completion=False)

    def train_and_evaluate(controller, steps):
        controller.train_and_evaluate(train_steps=controller.refresh_step() + steps,
                                      eval_steps=args.eval_steps, eval_interval=interval)

    blocked = {"sync": [], "async": []}  # Seconds each save() call blocked training.
    for name, controller in (("sync", with_sync), ("async", with_async)):
        controller.checkpoint_manager.save = _timed(controller.checkpoint_manager.save,
                                                    blocked[name])
    # Warm up: trace the train and eval loops, write a first checkpoint each.
    train_alone(interval)
    train_and_evaluate(with_sync, interval)
    train_and_evaluate(with_async, interval)
    eval_time = _time(lambda: with_sync.evaluate(args.eval_steps), 5)
    train_time = _time(lambda: train_alone(100), 5)
    eval_share = (eval_time * train_steps / interval) / (train_time * train_steps / 100)

    for calls in blocked.values():
        calls.clear()
    in_loops = _LoopTimer(alone.trainer)  # The three share the trainer.
    cpu = {}
    times = measure.interleave({
        "alone": in_loops.timing("alone", lambda: train_alone(train_steps)),
        "sync": in_loops.timing("sync", lambda: train_and_evaluate(with_sync, train_steps)),
        "async": in_loops.timing("async", lambda: train_and_evaluate(with_async, train_steps)),
    }, args.rounds, cpu=cpu)
    outside = {name: measure.median([(total - inside) / inside for total, inside in
                                     zip(times[name], in_loops.seconds[name])])
               for name in times}
    for name in ("sync", "async"):
        cost = measure.ratio(times[name], times["alone"]) - 1
        cpu_cost = measure.ratio(cpu[name], cpu["alone"]) - 1
        paired = measure.median([t / a for t, a in zip(times[name], times["alone"])]) - 1
        measure.emit(
            "controller_cost", workload="mlp", checkpoints=name, cost=cost,
            eval_share=eval_share, cost_without_eval=cost - eval_share,
            paired_cost_without_eval=paired - eval_share,
            cpu_cost_without_eval=cpu_cost - eval_share,
            direct_cost_without_eval=outside[name] - outside["alone"] - eval_share,
            loops_slowdown=measure.ratio(in_loops.seconds[name], in_loops.seconds["alone"]) - 1,
            overhead_per_interval_s=(
                measure.median(times["alone"]) * (cost - eval_share) * interval / train_steps),
            save_blocks_share=(measure.median(blocked[name]) * train_steps / interval
                               / measure.median(times["alone"])),
            train_steps=train_steps, interval=interval, eval_steps=args.eval_steps,
            rounds=args.rounds, target=f"cost_without_eval <= {COST_TARGET}",
            met=cost - eval_share <= COST_TARGET,
            met_in_cpu_time=cpu_cost - eval_share <= COST_TARGET)


def checkpoint_stall(args):
    steps_per_loop, saves = 20, args.saves
    controllers = {
        "none": loops.ctl_controller(BenchTask("wide"), steps_per_loop=steps_per_loop)[1],
        "sync": loops.ctl_controller(BenchTask("wide"), steps_per_loop=steps_per_loop,
                                     checkpoint_interval=steps_per_loop, max_checkpoints=2)[1],
        "async": loops.ctl_controller(BenchTask("wide"), steps_per_loop=steps_per_loop,
                                      checkpoint_interval=steps_per_loop, max_checkpoints=2,
                                      async_checkpointing=True)[1],
    }

    save_calls = {name: [] for name in controllers}
    for name, controller in controllers.items():
        controller.checkpoint_manager.save = _timed(controller.checkpoint_manager.save,
                                                    save_calls[name])

    def train(controller, loops_count):
        controller.train(int(controller.global_step.numpy()) + loops_count * steps_per_loop,
                         checkpoint_at_completion=False)

    for controller in controllers.values():
        train(controller, 2)
    for calls in save_calls.values():
        calls.clear()
    cpu = {}
    times = measure.interleave(
        {name: (lambda c=c: train(c, saves)) for name, c in controllers.items()}, args.rounds,
        cpu=cpu)
    extra = {name: measure.difference(times[name], times["none"]) / saves
             for name in ("sync", "async")}
    blocked = {name: measure.median(save_calls[name]) for name in ("sync", "async")}
    ratio = blocked["async"] / blocked["sync"]
    measure.emit(
        "checkpoint_stall", workload="wide",
        sync_stall_s=blocked["sync"], async_stall_s=blocked["async"], async_over_sync=ratio,
        sync_extra_train_s=extra["sync"], async_extra_train_s=extra["async"],
        cpu_sync_s=measure.difference(cpu["sync"], cpu["none"]) / saves,
        cpu_async_s=measure.difference(cpu["async"], cpu["none"]) / saves,
        loop_s=measure.median(times["none"]) / saves, saves_per_round=saves,
        steps_per_loop=steps_per_loop, rounds=args.rounds,
        target=f"async_over_sync <= {STALL_TARGET}", met=ratio <= STALL_TARGET)


class _LoopTimer:
    """Seconds each round spent inside `trainer.train` (the train loops), per variant."""

    def __init__(self, trainer):
        self.seconds = {}
        self._variant = None
        train = trainer.train

        def timed_train(*args, **kwargs):
            start = time.perf_counter()
            try:
                return train(*args, **kwargs)
            finally:
                self.seconds[self._variant][-1] += time.perf_counter() - start

        trainer.train = timed_train

    def timing(self, variant, run):
        def timed_run():
            self._variant = variant
            self.seconds.setdefault(variant, []).append(0.0)
            run()

        return timed_run


def _timed(save, seconds):
    """`save`, recording how long each call that wrote a checkpoint blocked."""

    def timed_save(*args, **kwargs):
        start = time.perf_counter()
        path = save(*args, **kwargs)
        if path is not None:
            seconds.append(time.perf_counter() - start)
        return path

    return timed_save


def _time(fn, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return measure.median(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--train_steps", type=int, default=30000)
    parser.add_argument("--interval", type=int, default=10000)
    parser.add_argument("--eval_steps", type=int, default=20)
    parser.add_argument("--saves", type=int, default=4)
    parser.add_argument("--figures", default="controller_cost,checkpoint_stall")
    args = parser.parse_args()
    measure.claim_stdout()
    figures = args.figures.split(",")
    if "controller_cost" in figures:
        controller_cost(args)
    if "checkpoint_stall" in figures:
        checkpoint_stall(args)


if __name__ == "__main__":
    main()
