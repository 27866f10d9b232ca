"""The composition root: the modes of a run, wired from every subsystem.

train, eval and train_and_eval on ctl's Controller, and continuous_eval on the
sidecar. This is the one module that names them all: the core's Trainer,
Controller, checkpoint manager and signal watcher (`ctl.core.stop`), the fault
handler and lock (`ctl.faults`), the progress line and metrics.jsonl (`ctl.hooks`), the
cluster's roles (`ctl.cluster`) and the sidecar (`ctl.sidecar`). Each plugs
into an extension point that core defines: hooks and train/eval actions
(`ctl.core.hook_protocol`), the Trainer's stop source, the checkpoint's contents
(`ctl.core.checkpoint_contents`).

`run_experiment` is what `python -m ctl.run` calls once flags and gin are
parsed; tests and notebooks call it directly. The run's two objects are made
once and passed down: the `ModelDir` (`ctl.model_dir`) and the `RunPlan`
(`ctl.cluster.run_plan`: what this process does for its mode and cluster;
`ctl.run` makes it from the flags and TF_CONFIG, a Python caller's comes from
its mode and strategy). Every mode builds its Trainer and binds its hooks
with `ctl.core.build_run`.
"""

import contextlib
import dataclasses
import functools
import shutil
import tempfile
import threading
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Union

import tensorflow as tf

from ctl.cluster.run_plan import MODES, RunPlan, plan as make_plan
from ctl import run_end
from ctl.hooks.hparams import HParamsSummary
from ctl.hooks.progress import MetricsLog
from ctl.config import gin_config as config
from ctl.core import contract
from ctl.utils import console
from ctl.model_dir.background import uploads
from ctl.core.checkpointing import CheckpointManager
from ctl.core.controller import BetweenLoops, Checkpoints, Controller, Summaries
from ctl.utils.errors import UserError, require_choice
from ctl.model_dir.evaluator_role import TRAINER, EvaluatorRole
from ctl.core.build_run import build_run
from ctl.core.hook_protocol import Hooks
from ctl.model_dir import Ahead, ModelDir, at_once
from ctl.core.summaries import SummaryManager
from ctl.core.runner import EvaluationStopped
from ctl.core.stop import SignalWatcher
from ctl.core.trainer import Trainer
from ctl.experiment import Experiment
from ctl.faults import resume
from ctl.faults.handler import FaultHandler, FaultTolerance
from ctl.model_dir.trainer_lock import ModelDirLock
from ctl.sidecar import continuous_eval



def run_experiment(
    mode: Union[str, RunPlan],
    model_dir: Union[str, ModelDir],
    strategy: Optional[tf.distribute.Strategy] = None,
    experiment: Optional[Experiment] = None,
    hooks: Sequence[Any] = (),
) -> Dict[str, Any]:
    """Runs `mode` on the gin-configured (or given) experiment in `model_dir`.

    `mode` is one of `ctl.MODES`, or the plan `python -m ctl.run` made from its
    flags and TF_CONFIG (`ctl.cluster.run_plan.RunPlan`). `hooks` run after the
    experiment's own (`ctl.Experiment.hooks`, kept as they are): for a program
    that runs a ctl run with a hook of its own (`python -m ctl.sweep.trial`'s
    pruning hook; `ctl.run.main`'s `hooks`).

    Returns the last evaluation's results (for `train`, the last loop's).
    `continuous_eval` runs `ctl.sidecar.continuous_eval.evaluate_continuously`. When
    TF_CONFIG's cluster has an `evaluator` task, `train_and_eval` only trains
    and leaves evaluation to that sidecar. A chief that finishes `train` or
    `train_and_eval` marks the run finished in `model_dir` and says where
    its results are (`ctl.run_end`); a run already complete writes
    nothing and returns its recorded results.

    Args:
        mode: what to run, one of `ctl.MODES`: `train`, `eval`, `train_and_eval` or `continuous_eval`.
        model_dir: the run's model dir: a path (local or `gs://`) or a `ModelDir`.
        strategy: the strategy to run under (None: the current one).
        experiment: the experiment (None: the gin-configured `ctl.Experiment`).
        hooks: hooks run after the experiment's own.

    Returns:
        The last evaluation's results (for `train`, the last loop's).

    Raises:
        UserError: a mistake of the user's: nothing to evaluate, a model dir that cannot be written, a checkpoint of
            another model.
    """
    directory = model_dir if isinstance(model_dir, ModelDir) else ModelDir(model_dir)
    strategy = strategy or tf.distribute.get_strategy()
    plan = mode if isinstance(mode, RunPlan) else make_plan(mode, strategy)
    require_choice("mode", plan.mode, MODES)  # Not smoke (`ctl.smoke`), not a serving task.
    # The sidecar too: an eval step that draws (dropout left on, a sampling generator) draws
    # there what `--mode=eval` draws on the same checkpoint.
    seed = _seed_before_building() if experiment is None else None
    if plan.sidecar:
        experiment = _with_hooks(experiment or config.call_configured(Experiment), hooks)
        if seed is None and experiment.fault_tolerance.seed is not None:  # An experiment given.
            resume.seed_everything(experiment.fault_tolerance.seed)
        _say_sources(experiment, plan)
        return continuous_eval.evaluate_continuously(directory, strategy, experiment=experiment,
                                                     settings=experiment.continuous_eval)
    # One trainer per model dir: whether another live one holds it is read meanwhile (in an
    # object store, a round trip or two beside building the experiment); asked below.
    lock = ModelDirLock(directory) if plan.locks else None
    held = Ahead(directory.path, lock.check, name="ctl-read-lock") if lock is not None else None
    if plan.leaves_eval_to_evaluator:
        console.info("train", "TF_CONFIG's cluster has an evaluator task: training without in-line eval")
    if not plan.train and not directory.checkpoints():
        raise UserError(
            f"--model_dir={directory} holds no checkpoint to evaluate; train first "
            "(--mode=train) or point --model_dir at a trained run."
        )
    experiment = _with_hooks(experiment or config.call_configured(Experiment), hooks)
    seeded = seed is not None and experiment.fault_tolerance.seed == seed
    _say_sources(experiment, plan)
    if plan.writes:  # Other workers only read the model dir.
        directory.check_writable()  # Writes nothing yet: a refused run leaves no trace.
    # Taken once the checkpoint is validated, so that a run refused for a bad input leaves
    # even the lock file as it was.
    if held is not None:
        held.result()  # Before reading checkpoints that a live trainer is retiring meanwhile.
    with contextlib.ExitStack() as stack:
        if lock is not None:
            stack.callback(lock.release)
        watcher = stack.enter_context(SignalWatcher()) if plan.train else None
        checkpoint_dir = stack.enter_context(_checkpoint_directory(directory, plan.chief))
        return _run(plan, directory, strategy, experiment, stack,
                    checkpoint_dir=checkpoint_dir, lock=lock, watcher=watcher, seeded=seeded)


def _seed_before_building() -> Optional[int]:
    """Seeds the process with `ctl.FaultTolerance.seed`, if gin sets one, before the gin-configured
    experiment (its task) is built; returns the seed (None: none set).

    A task may make TensorFlow resources as it is built (Model Garden's WMT task, its
    SentencePiece tokenizer), which a seed set later would drop: `tf.random.set_seed` clears
    TensorFlow's kernel cache. And its random draws are then the same in every run."""
    seed = config.call_configured(FaultTolerance).seed
    if seed is not None:
        resume.seed_everything(seed)
    return seed


def _say_sources(experiment: Experiment, plan: RunPlan) -> None:
    """The run's start: where each setting away from ctl's default came from (the task's config,
    or yours over it), and a strategy the task's config names that this run does not run."""
    if not plan.chief:
        return
    for line in experiment.sources:
        console.info("setup", "%s", line)
    for setting in experiment.task.config_settings():
        if setting.name == "--strategy" and plan.strategy and setting.value != plan.strategy:
            console.info("setup", "--strategy=%s; the experiment's %s (%s) is not used: --strategy "
                         "wins (python -m ctl.train takes the experiment's without it)",
                         plan.strategy, setting.source, setting.value)


def _with_hooks(experiment: Experiment, hooks: Sequence[Any]) -> Experiment:
    """`experiment` with `hooks` after its own, but for one equal to one of its own (e.g. the
    same `ctl.hooks.BestCheckpoint`: a sweep's trial keeps the best checkpoint by its objective)."""
    hooks = [hook for hook in hooks if not any(hook == own for own in experiment.hooks)]
    if not hooks:
        return experiment
    return dataclasses.replace(experiment, hooks=(*experiment.hooks, *hooks))


@contextlib.contextmanager
def _checkpoint_directory(directory: ModelDir, chief: bool):
    """The model dir for the chief; for other multi-worker workers, a scratch dir.

    MultiWorkerMirroredStrategy needs every worker to save (the save reads
    variables collectively); only the chief's checkpoints land in the model dir.
    The others restore from it and delete their scratch copies at the end.
    """
    if chief:
        yield directory
        return
    scratch = tempfile.mkdtemp(prefix="ctl-worker-checkpoints-")
    try:
        yield ModelDir(scratch)  # Checkpoints only; no other file of a model dir goes there.
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


class Built(NamedTuple):
    """What `build_controller` returns.

    Args:
        trainer: the run's Trainer.
        controller: the Controller that drives it.
        faults: the fault handler; None unless training.
        hooks: the bound hooks.
        eval_side: the evaluator role's claim, released when the run ends (None: not held).
    """

    trainer: Trainer
    controller: Controller
    faults: Optional[FaultHandler]  # None unless training.
    hooks: Hooks
    eval_side: Optional[EvaluatorRole] = None  # Release its claim when the run ends.


def build_controller(plan: RunPlan, directory: ModelDir, strategy: tf.distribute.Strategy,
                     experiment: Experiment, *, checkpoint_dir: Optional[ModelDir] = None,
                     watcher: Optional[SignalWatcher] = None,
                     lock: Optional[ModelDirLock] = None, seeded: bool = False) -> Built:
    """Builds the trainer, fault handler, hooks and Controller that `run_experiment` drives.

    Restores the latest checkpoint in `directory` (or initializes); writes
    nothing. Training needs a `watcher`. `bench/` drives the returned
    controller directly, so that it measures ctl's real loop.

    Args:
        plan: what this process runs (`RunPlan`).
        directory: the run's model dir.
        strategy: the strategy to build under.
        experiment: the experiment.
        checkpoint_dir: where checkpoints are saved (a multi-worker non-chief's scratch dir; None: `directory`).
        watcher: the run's signal watcher (needed to train).
        lock: the trainer's claim on the model dir, or None.
        seeded: the process was seeded with the experiment's seed before it was built
            (`run_experiment`): seeding again would drop what its task made.
    """
    schedule = experiment.schedule
    if experiment.fault_tolerance.seed is not None and not seeded:
        resume.seed_everything(experiment.fault_tolerance.seed)
    # ctl's JSON metrics and (training) HParams summary, on the chief, before the experiment's.
    builtin = ([MetricsLog()] + ([HParamsSummary()] if plan.hparams else [])) if plan.writes else []
    trainer, hooks = build_run(
        experiment, strategy, directory, train=plan.train, evaluate=plan.evaluate,
        chief=plan.chief, stop=watcher if plan.train else None,
        guard_steps=experiment.fault_tolerance.guard_steps, builtin=builtin)
    manager = CheckpointManager(
        trainer.checkpoint,
        checkpoint_dir or directory,
        restore_directory=directory,
        max_to_keep=schedule.max_checkpoints,
        step_counter=trainer.global_step,
        checkpoint_interval=schedule.checkpoint_interval,
        init_fn=hooks.initialize,  # The hooks' on_initialize, then the task's initialize.
    )
    faults = (FaultHandler(experiment.fault_tolerance, trainer, manager, watcher, lock)
              if plan.train else None)
    train_actions: List[Callable[[Any], None]] = []
    if plan.train and plan.writes:
        train_actions.append(_OnceAfterFirstLoop(directory))
    train_actions += hooks.actions("on_train_loop_end")
    eval_actions = hooks.actions("on_eval_end")
    eval_side = None
    if plan.eval_side:  # One process runs the eval-side hooks of a model dir.
        eval_side = EvaluatorRole(directory, TRAINER, hooks.actions("on_eval_end", builtin=False))
        eval_side.read_ahead()
        eval_actions = hooks.actions("on_eval_end", builtin=True) + [eval_side]
    controller = Controller(
        strategy=strategy,
        trainer=trainer if plan.train else None,
        evaluator=trainer if plan.evaluate else None,
        global_step=trainer.global_step,
        steps_per_loop=schedule.steps_per_loop,
        checkpoints=Checkpoints(manager, asynchronous=schedule.async_checkpointing,
                                on_end=hooks.actions("on_checkpoint_end"),
                                on_load=hooks.actions("on_checkpoint_load")),
        summaries=Summaries(
            train=SummaryManager(directory.train_dir if plan.writes else None, trainer.global_step),
            eval=SummaryManager(directory.eval_dir if plan.writes else None, trainer.global_step),
            interval=schedule.summary_interval),
        between_loops=BetweenLoops(after_train_loop=[faults] if faults else [],
                                   train_actions=train_actions, eval_actions=eval_actions,
                                   stop=hooks.run.stop,
                                   before_writing=lock.stop_if_taken if lock is not None else None),
    )
    hooks.run.step_fn = lambda: controller.step  # The controller owns the current step.
    return Built(trainer, controller, faults, hooks, eval_side)


def _run(plan: RunPlan, directory: ModelDir, strategy: tf.distribute.Strategy,
         experiment: Experiment, stack: contextlib.ExitStack, *, checkpoint_dir: ModelDir,
         lock: Optional[ModelDirLock], watcher: Optional[SignalWatcher],
         seeded: bool = False) -> Dict[str, Any]:
    schedule = experiment.schedule
    # The dir's records this run reads before it trains, read while it builds and traces (in an
    # object store, beside it: each read is a round trip). Read as late as its restore, which
    # comes before the lock too; a trainer that wrote them since would hold the lock.
    marked = Ahead(directory.path, lambda: tf.io.gfile.exists(directory.finished_file),
                   name="ctl-read-finished") if plan.train else None
    recorded = (Ahead(directory.path, directory.evaluations_on_record, name="ctl-read-evaluations")
                if plan.in_line_eval else None)
    trainer, controller, faults, hooks, eval_side = build_controller(
        plan, directory, strategy, experiment,
        checkpoint_dir=checkpoint_dir, watcher=watcher, lock=lock, seeded=seeded,
    )
    stack.callback(uploads().wait)  # Last: what the run wrote to an object store is there.
    stack.callback(controller.summary_manager.close)  # Object stores: their staging dirs go.
    stack.callback(controller.eval_summary_manager.close)
    stack.callback(controller.checkpoint_manager.close)
    if eval_side is not None:
        stack.callback(eval_side.release)
    # Traces, runs nothing: the loops' own traces, under what the loops run under (the summaries'
    # writers, whose event files a refused run removes: it leaves the model dir as it found it).
    # The eval step's trace of a one-process train_and_eval run runs on the claim's thread when
    # the first train loop ended, before the run's first write (`ModelDirLock.acquire_aside`),
    # and a refusal stops it there.
    # In an object store the trainer's lease is taken beside these checks too (`early`): its
    # record settles meanwhile, and a refusal puts it back as it was.
    eval_beside = plan.in_line_eval and plan.one_process and lock is not None
    early = lock is not None and plan.train and lock.settles
    summaries = (controller.summary_manager, controller.eval_summary_manager)
    for manager in summaries:  # In an object store: nothing uploaded before the first write.
        manager.hold()
    checked = threading.Event()  # `check_run` ended,
    passed: List[bool] = []  # and passed.

    def check_run() -> None:
        try:
            contract.check_run(trainer, schedule.eval_steps, plan.train, plan.evaluate,
                               trace_loop=True, loop_context=controller.train_loop_context,
                               eval_context=controller.eval_summary_manager.tracing,
                               trace_eval=not eval_beside)
            passed.append(True)
        except BaseException:
            _discard_summaries(controller)
            raise
        finally:
            checked.set()

    if not early:
        check_run()

    check_eval = functools.partial(  # On the claim's thread.
        contract.check_eval, trainer, schedule.eval_steps, controller.eval_summary_manager.tracing)

    def checks_while_settling() -> None:  # On the claim's thread (`early`).
        checked.wait()  # The train step's trace first: the eval step's follows it.
        if not passed:
            raise _Refused("the run's checks refused it")  # Said on the caller's thread.
        if eval_beside:
            check_eval()

    def checks_then_reads() -> None:  # On the caller's thread (`early`).
        check_run()
        before_writing()

    claimed: List[bool] = []  # The first writes began: the model dir is this run's.

    def discard_if_refused() -> None:
        # Refused (a check, the claim another trainer took since `check`, the reads): what the
        # summaries' writers made goes (the checks' traces, the first loop's summaries). Once
        # the claim's thread ended: a run may end on an error of its own before.
        if lock is None:
            return
        lock.join_aside()
        if not claimed:
            _discard_summaries(controller)

    stack.callback(discard_if_refused)
    done: List[Optional[Dict[str, Any]]] = []

    def before_writing() -> None:  # Reads only: runs while the lease settles.
        if plan.train:
            done.append(run_end.completed_run(
                directory, schedule.train_steps, evaluate=plan.in_line_eval,
                marked=marked.result(), recorded=recorded.result if recorded else None))
            if done[0] is None:
                faults.resume_inputs()

    def first_writes() -> None:  # Everything is validated.
        claimed.append(True)
        # Independent: side by side in an object store (one after the other on a file system,
        # where the dir comes first).
        complete = bool(done and done[0] is not None)  # This run writes nothing more.
        writes: Dict[str, Callable[[], None]] = {}
        if plan.writes:
            writes["dir"] = directory.create
        if plan.marks_finished and not complete:
            if marked is None or marked.result():
                writes["finished"] = directory.clear_finished
            writes["config"] = lambda: config.save_config(directory)
        at_once(directory.path, writes)
        if not complete:
            for manager in summaries:
                manager.let_go()

    # Before anything else is written; raises UserError if held. In an object store the
    # lease settles beside the first train loop; the run's first write waits for it.
    if lock is None:
        before_writing()
        first_writes()
    elif early:
        lock.acquire_aside(checks_then_reads, first_writes, checks_while_settling)
    elif plan.train:
        lock.acquire_aside(before_writing, first_writes, check_eval if eval_beside else None)
    else:
        lock.acquire(before_writing)
        first_writes()
    if done and done[0] is not None:  # Validated (config, checkpoint, lock): already complete.
        if lock is not None:
            lock.decided()
        _discard_summaries(controller)  # The checks' traces made writers; this run writes nothing.
        if plan.writes:
            run_end.say_complete(directory, schedule.train_steps, done[0])
        return done[0]

    try:
        evaluations = (_Evaluations(recorded.result(), eval_side if plan.steps_aside else None,
                                    before=lock.decided if lock is not None else None)
                       if recorded is not None else None)
        output = _run_mode(plan, controller, schedule, evaluations)
    except EvaluationStopped:  # A signal during an in-line evaluation.
        faults.preempt(controller.step)
    finally:
        controller.flush_summaries()  # What was kept since (an evaluation's rate), also on an error.
    if lock is not None:
        lock.decided()  # A run that ran no train loop (its steps were done).
        lock.ending()  # Released once the run's end is written: no renewal meanwhile.
    latest = controller.checkpoint_manager.latest_checkpoint
    # The final checkpoint is committed (`train` and `train_and_evaluate` waited for it): the
    # mark goes now, beside the hooks' end and the end's reads (an object store's round trips).
    marking = (Ahead(directory.path, lambda: directory.mark_finished(
        controller.step, latest, schedule.train_steps), name="ctl-mark-finished")
        if plan.marks_finished else None)
    try:
        hooks.call("on_trial_close", output)
    except BaseException:
        if marking is not None:
            with contextlib.suppress(Exception):  # Landed before the lease goes; the hook's error.
                marking.result()
        raise
    if plan.marks_finished:
        evaluated = evaluations is not None and controller.step in evaluations.evaluated
        # What this run knows of its end is not read again (`run_end.Known`).
        run_end.say_done(directory, controller.step, output if plan.evaluate else None,
                         known=run_end.Known(
                             latest=latest, evaluated=evaluated or None,
                             train=controller.summary_manager.wrote or None,
                             eval=controller.eval_summary_manager.wrote or None),
                         written=marking.result)
    return output


class _Refused(Exception):
    """The run's checks on the caller's thread refused it (their error is the one raised)."""


def _discard_summaries(controller: Controller) -> None:
    """Removes what the summaries' writers made for a run refused before its first write (the
    eval writer's first: it was made second, in the dir the train writer may have made)."""
    controller.eval_summary_manager.discard()
    controller.summary_manager.discard()


def _run_mode(plan: RunPlan, controller: Controller, schedule,
              evaluations: Optional["_Evaluations"]) -> Dict[str, Any]:
    eval_steps = schedule.eval_steps or -1
    if not plan.train:
        return controller.evaluate(steps=eval_steps)
    if not plan.evaluate:
        controller.train(steps=schedule.train_steps)
        return {}
    output = controller.train_and_evaluate(
        train_steps=schedule.train_steps,
        eval_steps=eval_steps,
        eval_interval=schedule.eval_interval,
        skip_evaluation=evaluations.skip,
    )
    if output is None:  # Resumed at the last step, already evaluated: its recorded results.
        output = evaluations.recorded.get(controller.step, {})
    return output


class _Evaluations:
    """Which in-line evaluations of `train_and_eval` run: none at a step already
    evaluated (in-line or by a sidecar: `metrics.jsonl`, `eval/metrics.jsonl`,
    read once at start), and none while a live sidecar evaluator serves the model
    dir (`ctl.model_dir.evaluator_role`, given as `in_line` when the plan steps aside:
    one-process strategies, the workers of a cluster must agree on every
    evaluation). Evaluating, the chief holds the evaluator role until the
    evaluation's eval-side hooks ran (`EvaluatorRole.steps_aside`)."""

    def __init__(self, recorded: Dict[Any, Dict[str, Any]], in_line: Optional[EvaluatorRole],
                 before: Optional[Callable[[], None]] = None):
        self.recorded = recorded  # `ModelDir.evaluations_on_record()`.
        self.in_line = in_line
        self.before = before  # The trainer's claim, decided before an evaluation writes.
        self.evaluated = set(recorded)  # Steps on record, or evaluated in-line by this run.

    def skip(self, step: int) -> bool:
        if self.before is not None:
            self.before()
        skipped = step in self.recorded or bool(self.in_line and self.in_line.steps_aside(step))
        if not skipped:
            self.evaluated.add(step)  # Evaluated now: a run whose evaluation fails ends here.
        return skipped


class _OnceAfterFirstLoop:
    """Train action: saves the operative config once the first loop has run."""

    def __init__(self, directory: ModelDir):
        self._directory = directory
        self._done = False

    def __call__(self, unused_output) -> None:
        if not self._done:
            config.save_operative_config(self._directory)
            self._done = True
