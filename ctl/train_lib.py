"""The modes of a run: train, eval, and train_and_eval, on orbit's Controller.

`run_experiment` is what `python -m ctl.run` calls once flags and gin are
parsed; tests and notebooks call it directly.
"""

import os
from typing import Any, Dict, Optional, Tuple

from absl import logging
import orbit
import tensorflow as tf

from ctl import async_checkpoint, config
from ctl.checkpointing import CheckpointManager
from ctl.distribute import is_chief
from ctl.errors import UserError
from ctl.experiment import Experiment
from ctl.summaries import SummaryManager
from ctl.trainer import Trainer

MODES = ("train", "eval", "train_and_eval")
TRAIN_SUMMARY_DIR = "train"
EVAL_SUMMARY_DIR = "eval"


def run_experiment(
    mode: str,
    model_dir: str,
    strategy: Optional[tf.distribute.Strategy] = None,
    experiment: Optional[Experiment] = None,
) -> Dict[str, Any]:
    """Runs `mode` on the gin-configured (or given) experiment in `model_dir`.

    Returns the last evaluation's results (for `train`, the last loop's).
    """
    if mode not in MODES:
        raise UserError(f"Received mode={mode!r}. Expected one of: {', '.join(MODES)}.")
    strategy = strategy or tf.distribute.get_strategy()
    if mode == "eval" and tf.train.latest_checkpoint(model_dir) is None:
        raise UserError(
            f"--model_dir={model_dir} holds no checkpoint to evaluate; train first "
            "(--mode=train) or point --model_dir at a trained run."
        )
    ensure_writable(model_dir)
    experiment = experiment or config.call_configured(Experiment)
    schedule = experiment.schedule
    _, controller = build_controller(mode, model_dir, strategy, experiment)
    if mode != "eval" and is_chief(strategy):
        config.save_config(model_dir)

    eval_steps = schedule.eval_steps or -1
    if mode == "eval":
        return controller.evaluate(steps=eval_steps)
    if mode == "train":
        controller.train(steps=schedule.train_steps)
        return {}
    output = controller.train_and_evaluate(
        train_steps=schedule.train_steps,
        eval_steps=eval_steps,
        eval_interval=schedule.eval_interval,
    )
    if output is None:  # Resumed after the last step: still end with an evaluation.
        logging.info("training already reached step %d", schedule.train_steps)
        output = controller.evaluate(steps=eval_steps)
    return output


def build_controller(
    mode: str,
    model_dir: str,
    strategy: tf.distribute.Strategy,
    experiment: Experiment,
) -> Tuple[Trainer, orbit.Controller]:
    """Builds the trainer and the `orbit.Controller` that `run_experiment` drives.

    Restores the latest checkpoint in `model_dir` (or calls the task's
    `initialize`). Benchmarks drive the returned controller directly.
    """
    schedule = experiment.schedule
    train = mode != "eval"
    evaluate = mode != "train"
    trainer = experiment.trainer_cls(
        experiment.task, strategy=strategy, train=train, evaluate=evaluate
    )
    chief = is_chief(strategy)
    summary_dir = os.path.join(model_dir, TRAIN_SUMMARY_DIR)
    eval_summary_dir = os.path.join(model_dir, EVAL_SUMMARY_DIR)
    if schedule.async_checkpointing:
        async_checkpoint.enable()
    controller = orbit.Controller(
        strategy=strategy,
        trainer=trainer if train else None,
        evaluator=trainer if evaluate else None,
        global_step=trainer.global_step,
        steps_per_loop=schedule.steps_per_loop,
        checkpoint_manager=CheckpointManager(
            trainer.checkpoint,
            model_dir,
            max_to_keep=schedule.max_checkpoints,
            step_counter=trainer.global_step,
            checkpoint_interval=schedule.checkpoint_interval,
            init_fn=lambda: experiment.task.initialize(trainer.model),
        ),
        enable_async_checkpointing=schedule.async_checkpointing,
        summary_interval=schedule.summary_interval,
        # orbit uses the dirs only to decide whether train and eval share a manager.
        summary_dir=summary_dir if chief else None,
        eval_summary_dir=eval_summary_dir if chief else None,
        summary_manager=SummaryManager(summary_dir if chief else None, trainer.global_step),
        eval_summary_manager=SummaryManager(
            eval_summary_dir if chief else None, trainer.global_step
        ),
        train_actions=[_OnceAfterFirstLoop(model_dir, summary_dir)] if train and chief else (),
    )
    return trainer, controller


def ensure_writable(model_dir: str) -> None:
    """Creates `model_dir` if needed; raises `UserError` if it cannot be written."""
    probe = os.path.join(model_dir, f".ctl-write-probe-{os.getpid()}")
    try:
        tf.io.gfile.makedirs(model_dir)
        with tf.io.gfile.GFile(probe, "w") as f:
            f.write("")
        tf.io.gfile.remove(probe)
    except (tf.errors.OpError, OSError) as error:
        raise UserError(
            f"cannot write to --model_dir={model_dir} ({error}); choose a directory you "
            "can write to."
        ) from error


class _OnceAfterFirstLoop:
    """Train action: saves the operative config once the first loop has run."""

    def __init__(self, model_dir: str, summary_dir: str):
        self._model_dir = model_dir
        self._summary_dir = summary_dir
        self._done = False

    def __call__(self, unused_output) -> None:
        if not self._done:
            config.save_operative_config(self._model_dir, self._summary_dir)
            self._done = True
