"""The loops being compared, each built from the same `BenchTask`.

Each builder returns a callable `run(num_steps)` (or `evaluate(num_steps)`)
that trains (evaluates) that many steps in loops of `steps_per_loop`, and is
warmed up (traced) once before it is returned.

- raw:   what one writes by hand: a `tf.function` with a `tf.range` loop over
         the task's train step, a loss mean and the metrics, reset before and
         read back after each loop call (eagerly, as tutorials do). The
         issue's targets are ratios to this loop.
- raw_fused: the same, written for speed: the resets and reads inside the
         loop's `tf.function`, one call per loop (what ctl's Trainer does);
         a reference for what is left of ctl's own overhead. Its eval form
         also comes as ctl's twin (`ctl_eval_and_twin`): over the model and
         eval dataset of one ctl build, ending each finished iterator on a
         thread of its own as ctl does (and once more ending it in place).
- orbit: `orbit.StandardTrainer` driven by `orbit.Controller`, used directly
         (no summaries, no checkpoints).
- ctl:   ctl's `Trainer` and Controller as `ctl.run` builds them
         (`train_lib.build_controller`): loop summaries to the model dir and
         the operative-config action included; no checkpoint inside the
         measured calls (figures 3 and 4 measure those).
- keras: Keras 3 `compile(steps_per_execution=steps_per_loop)` + `fit`.
"""

import functools
import tempfile
import threading

import keras
import orbit
import tensorflow as tf

import ctl
from ctl import train_lib
from ctl.core.checkpointing import CheckpointManager
from ctl.core.controller import Checkpoints, Controller, Summaries
from ctl.core.loops import end_off_path as _end_off_path
from ctl.core.stop import SignalWatcher
from ctl.model_dir import ModelDir
from ctl.cluster.run_plan import RunPlan
from bench.workloads import BenchTask, dataset

NEVER = 10**9


def raw_train_loop(task: BenchTask, fused: bool):
    """The hand-written train loop over `task`: `(loop, iterator, metrics, optimizer)`, the loss
    mean first among the metrics."""
    model, optimizer = task.build_model(), task.build_optimizer()
    optimizer.build(model.trainable_variables)
    loss_mean = keras.metrics.Mean("loss")
    metrics = [loss_mean, *task.build_metrics(training=True)]

    @tf.function
    def loop(iterator, num_steps):
        if fused:
            _reset(metrics)
        for _ in tf.range(num_steps):
            logs = task.train_step(next(iterator), model, optimizer, metrics[1:])
            loss_mean.update_state(logs["loss"])
        return _results(metrics) if fused else None

    return loop, iter(task.build_inputs(training=True)), metrics, optimizer


def raw_train(task: BenchTask, steps_per_loop: int, fused: bool = False):
    """The hand-written loop; `fused`: metric resets and reads inside its `tf.function` too."""
    loop, iterator, metrics, optimizer = raw_train_loop(task, fused)
    num_steps = tf.constant(steps_per_loop)

    def run(steps):
        for _ in range(steps // steps_per_loop):
            if fused:
                _numpy(loop(iterator, num_steps))
            else:
                _reset(metrics)
                loop(iterator, num_steps)
                _numpy(_results(metrics))

    run(steps_per_loop)
    run.optimizer = optimizer  # Its `iterations` count the steps run (tests/test_bench.py).
    return run


def raw_eval(task: BenchTask, fused: bool = False, model=None, data=None,
             end_off_path: bool = False):
    """The hand-written eval loop; `fused` as in `raw_train`.

    `model`, `data`: evaluate that model on that dataset (another loop's: see
    `ctl_eval_and_twin`) instead of building them from `task`.
    `end_off_path`: end each finished iterator on a thread of its own, with
    ctl's own `end_off_path`, instead of on the caller's path.
    """
    model = task.build_model() if model is None else model
    loss_mean = keras.metrics.Mean("loss")
    metrics = [loss_mean, *task.build_metrics(training=False)]
    data = task.build_inputs(training=False) if data is None else data

    @tf.function
    def loop(iterator, num_steps):
        if fused:
            _reset(metrics)
        for _ in tf.range(num_steps):
            features, labels = next(iterator)
            outputs = model(features, training=False)
            loss_mean.update_state(task.build_losses(labels, outputs))
            for metric in metrics[1:]:
                metric.update_state(labels, outputs)
        return _results(metrics) if fused else None

    def evaluate(num_steps):
        iterator = iter(data)
        if fused:
            results = _numpy(loop(iterator, tf.constant(num_steps)))
        else:
            _reset(metrics)
            loop(iterator, tf.constant(num_steps))
            results = _numpy(_results(metrics))
        if end_off_path:
            _end_off_path(iterator)
        return results

    evaluate(10)
    return evaluate


def _reset(metrics):
    for metric in metrics:
        metric.reset_state()


def _results(metrics):
    return {metric.name: metric.result() for metric in metrics}


def _numpy(results):
    return {name: value.numpy() for name, value in results.items()}


class _OrbitTrainer(orbit.StandardTrainer):
    def __init__(self, task):
        self.task = task
        self.model, self.optimizer = task.build_model(), task.build_optimizer()
        self.optimizer.build(self.model.trainable_variables)
        self.global_step = orbit.utils.create_global_step()
        self.loss = keras.metrics.Mean("loss")
        self.metrics = task.build_metrics(training=True)
        super().__init__(task.build_inputs(training=True))

    def train_loop_begin(self):
        for metric in [self.loss, *self.metrics]:
            metric.reset_state()

    def train_step(self, iterator):
        logs = self.task.train_step(next(iterator), self.model, self.optimizer, self.metrics)
        self.loss.update_state(logs["loss"])
        self.global_step.assign_add(1)

    def train_loop_end(self):
        return {m.name: m.result() for m in [self.loss, *self.metrics]}


def orbit_train(task: BenchTask, steps_per_loop: int):
    trainer = _OrbitTrainer(task)
    controller = orbit.Controller(
        trainer=trainer, global_step=trainer.global_step, steps_per_loop=steps_per_loop)
    return drive(controller, steps_per_loop)


def ctl_controller(task: ctl.Task, mode: str = "train", model_dir: str = None,
                   trainer_options=None, fault_tolerance=None, trainer_cls=None, **schedule):
    """ctl's trainer and controller for `task`, as `ctl.run` builds them (`trainer_cls`: a
    subclass of `ctl.Trainer` in its place, as `ctl.Experiment.trainer_cls` would name it)."""
    schedule.setdefault("checkpoint_interval", NEVER)
    base = trainer_cls or ctl.Trainer
    trainer_cls = base
    if trainer_options:  # As gin's `ctl.Trainer.<option> = ...` would bind them.
        trainer_cls = type("BenchTrainer", (base,), {
            "__init__": functools.partialmethod(base.__init__, **trainer_options)})
    experiment = ctl.Experiment(task=task, schedule=ctl.Schedule(train_steps=NEVER, **schedule),
                                trainer_cls=trainer_cls,
                                fault_tolerance=fault_tolerance or ctl.FaultTolerance())
    model_dir = model_dir or tempfile.mkdtemp(prefix="ctl-bench-")
    built = train_lib.build_controller(RunPlan(mode), ModelDir(model_dir), tf.distribute.get_strategy(), experiment,
                                       watcher=_watcher() if mode != "eval" else None)
    return built.trainer, built.controller


def sibling_controller(controller: Controller, checkpoint_interval: int,
                       async_checkpointing: bool = False, max_checkpoints: int = 5) -> Controller:
    """Another controller over `controller`'s trainer, with its own checkpoints.

    It shares everything else (trainer and evaluator, summaries, actions,
    fault handler), so that variants built this way differ only in their
    checkpoints: figure 3 compares them free of the speed differences between
    separately built models and iterators. Drive each with `refresh_step()` first:
    the step a controller keeps is stale once a sibling has trained.
    """
    trainer = controller.trainer
    manager = CheckpointManager(trainer.checkpoint, ModelDir(tempfile.mkdtemp(prefix="ctl-bench-")),
                                step_counter=trainer.global_step, max_to_keep=max_checkpoints,
                                checkpoint_interval=checkpoint_interval)
    return Controller(
        global_step=trainer.global_step, trainer=trainer, evaluator=controller.evaluator,
        strategy=controller.strategy, steps_per_loop=controller.steps_per_loop,
        checkpoints=Checkpoints(manager, asynchronous=async_checkpointing),
        summaries=Summaries(controller.summary_manager, controller.eval_summary_manager),
        between_loops=controller.between_loops)


def _watcher():
    """The SIGTERM/SIGINT watcher ctl trains under, installed once for the process."""
    global _WATCHER
    if _WATCHER is None:
        _WATCHER = SignalWatcher().__enter__()
    return _WATCHER


_WATCHER = None


def release_watcher() -> None:
    """Gives SIGTERM/SIGINT their previous handlers back (for in-process users such as tests)."""
    global _WATCHER
    if _WATCHER is not None:
        _WATCHER.__exit__(None, None, None)
        _WATCHER = None


def ctl_train(task: BenchTask, steps_per_loop: int, stop_check: str = "step", **trainer_options):
    """ctl's loop; `stop_check`: `ctl.FaultTolerance.stop_check` ('loop': no per-step guard);
    `trainer_options`: arguments of `ctl.Trainer` (e.g. jit_compile=True)."""
    _, controller = ctl_controller(task, steps_per_loop=steps_per_loop,
                                   trainer_options=trainer_options,
                                   fault_tolerance=ctl.FaultTolerance(stop_check=stop_check))
    return drive(controller, steps_per_loop)


def ctl_eval(task: BenchTask):
    return ctl_eval_and_twin(task)[0]


def ctl_eval_and_twin(task: BenchTask):
    """ctl's evaluation, its twin, the twin ending its iterators in place, and their model.

    The twin is the fused hand-written eval loop over the same model and eval
    dataset (the trainer's), so that whatever the objects of one build cost or
    save (bench/eval_throughput.py) is the same on both sides. It ends each
    finished iterator on a thread of its own, as ctl does; the third loop ends
    it on the caller's path, as figure 2's twin did until 2026-11-25f.
    """
    trainer, controller = ctl_controller(task, mode="eval")

    def evaluate(num_steps):
        return controller.evaluate(steps=num_steps)

    evaluate(10)
    twin, in_place = (raw_eval(task, fused=True, model=trainer.eval_model,
                               data=trainer.eval_dataset, end_off_path=off_path)
                      for off_path in (True, False))
    return evaluate, twin, in_place, trainer.eval_model


def drive(controller, steps_per_loop):
    """`run(num_steps)`: `controller.train` to `num_steps` past the step it is at.

    ctl's Controller keeps that step on the host (`step`); an eager read of the
    variable right after the last round's loop costs 0.3-0.45 ms a round here,
    which the hand-written loops do not pay. orbit's reads its variable
    itself in every `train` call, so the driver does too.
    """
    def current_step():
        if isinstance(controller, Controller):
            return controller.step
        return int(controller.global_step.numpy())

    def run(num_steps):
        target = current_step() + num_steps
        controller.train(steps=target, checkpoint_at_completion=False)

    run(steps_per_loop)
    run.global_step = controller.global_step  # It counts the steps run (tests/test_bench.py).
    return run


def keras_fit(task: BenchTask, steps_per_loop: int, steps_per_call: int,
              jit_compile: bool = False, mixed_precision: str = None):
    """Keras 3 `compile(steps_per_execution=steps_per_loop)` + one persistent `fit` call.

    The `fit` call runs on its own thread for the whole comparison, an epoch
    of `steps_per_call` steps each time `run` is called: fit's epoch iterator,
    callbacks and prefetch threads are set up once, as in any real use of
    `fit`, and its per-epoch work (metric reset and read, callbacks) is timed.
    `mixed_precision`: Keras' dtype policy while the model is built, as
    `ctl.Trainer.mixed_precision` sets it.
    """
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(mixed_precision or previous)
    try:
        model = task.build_model()
    finally:
        keras.mixed_precision.set_global_policy(previous)
    model.compile(
        optimizer=task.build_optimizer(),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=task.build_metrics(training=True),
        steps_per_execution=steps_per_loop,
        jit_compile=jit_compile,
    )
    fit = _PersistentFit(model, dataset(task.workload, training=True, seed=task.seed),
                         steps_per_call)
    fit.run(steps_per_call)  # Warm-up: traces the train function.
    return fit.run


class _PersistentFit:
    """`model.fit` on a thread, one epoch per `run` call; the thread waits between epochs."""

    TIMEOUT_S = 600

    def __init__(self, model, data, steps_per_epoch: int):
        self.model = model
        self.steps_per_epoch = steps_per_epoch
        self._go = threading.Semaphore(0)
        self._done = threading.Semaphore(0)
        self._error = None
        pause = keras.callbacks.LambdaCallback(
            on_epoch_begin=lambda epoch, logs: self._go.acquire(),
            on_epoch_end=lambda epoch, logs: self._done.release())

        def fit():
            try:
                model.fit(data, epochs=NEVER, steps_per_epoch=steps_per_epoch, verbose=0,
                          callbacks=[pause])
            except BaseException as error:  # noqa: BLE001 - handed to the caller of run().
                self._error = error
                self._done.release()

        threading.Thread(target=fit, name="bench-keras-fit", daemon=True).start()

    def run(self, num_steps: int) -> None:
        if num_steps != self.steps_per_epoch:
            raise ValueError(f"this fit runs epochs of {self.steps_per_epoch} steps, not {num_steps}")
        self._go.release()
        if not self._done.acquire(timeout=self.TIMEOUT_S) or self._error is not None:
            raise RuntimeError(f"Keras fit did not finish an epoch: {self._error!r}")
