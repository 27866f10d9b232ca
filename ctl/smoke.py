"""`--mode=smoke`: a seconds-long rehearsal of a run, to catch config and shape errors.

    python -m ctl.run --mode=smoke --gin_file=configs/digits.gin

In a temporary directory (deleted afterwards; `--model_dir` is not touched),
with the configured task and hooks but a tiny schedule, it runs in order:

    train      SMOKE_STEPS train steps, one per loop, a checkpoint after each
    eval       one eval batch (the experiment's hooks see its results)
    restore    a fresh trainer restores the last checkpoint and must reproduce
               the step and the eval results
    export     the task's serving signatures are exported, loaded with
               tf.saved_model.load, and must give the restored model's outputs

and prints `smoke: PASS ...`, or names the stage that failed and the error in
one line on stderr (exit status 2) after logging the traceback on stdout. The
rehearsed run's closing `done` lines (where its files are, the command to look
at them) are left out: they would name the temporary directory, gone by then.
Like Determined's `test=True` and Lightning's `fast_dev_run`.
"""

import dataclasses
import logging
import tempfile
import time
import traceback

import numpy as np
import tensorflow as tf

from ctl import train_lib
from ctl import run_end
from ctl.hooks.exporting import check_served, export_saved_model
from ctl.hooks.eval_results import flat_logs
from ctl.core import checkpointing
from ctl.core.build_run import build_run
from ctl.config import gin_config as config
from ctl.utils import console
from ctl.utils.errors import UserError, one_line
from ctl.model_dir import ModelDir
from ctl.experiment import Experiment, Schedule

SMOKE_STEPS = 2
STAGES = ("train", "eval", "restore", "export")
SMOKE_EXPORT_DIR = "smoke_export"  # In the smoke run's temporary model dir: its SavedModel.


def run_smoke(strategy=None, experiment=None) -> float:
    """Runs the smoke test; returns its duration in seconds or raises `UserError`.

    Args:
        strategy: the strategy to run under (None: the current one).
        experiment: the experiment (None: the gin-configured `ctl.Experiment`).
    """
    start = time.monotonic()
    strategy = strategy or tf.distribute.get_strategy()
    experiment = experiment or config.call_configured(Experiment)
    experiment = dataclasses.replace(experiment, schedule=Schedule(
        train_steps=SMOKE_STEPS, steps_per_loop=1, eval_steps=1, eval_interval=None,
        checkpoint_interval=1, max_checkpoints=SMOKE_STEPS))
    stage = "train"
    with tempfile.TemporaryDirectory(prefix="ctl-smoke-") as path:
        directory = ModelDir(path)
        try:
            console.LOGGER.addFilter(_without_closing_lines)
            try:
                results = train_lib.run_experiment("train_and_eval", directory, strategy, experiment)
            finally:
                console.LOGGER.removeFilter(_without_closing_lines)
            stage = "restore"
            # A fresh trainer, built as every mode builds one; no hooks of its own.
            trainer, _ = build_run(dataclasses.replace(experiment, hooks=()), strategy,
                                   directory, train=False, evaluate=True)
            latest = tf.train.latest_checkpoint(directory.path)
            with strategy.scope():
                # Optimizer slots a fresh optimizer makes lazily stay unread (restore allows it).
                checkpointing.restore(trainer.checkpoint, latest, directory)
            _check(int(trainer.global_step.numpy()) == SMOKE_STEPS,
                   f"restored step {int(trainer.global_step.numpy())}, expected {SMOKE_STEPS}")
            again = trainer.evaluate(tf.constant(1))
            _check_close(again, results, "the restored model's eval results")
            stage = "export"
            _export_and_compare(experiment.task, trainer, directory)
        except UserError as error:
            raise UserError(f"smoke test failed at {stage}: {error}") from error
        except Exception as error:  # Any failure is the answer here.
            console.info("smoke", "failed at %s:\n%s", stage, traceback.format_exc())
            raise UserError(f"smoke test failed at {stage}: {type(error).__name__}: "
                            f"{one_line(error)} (traceback on stdout)") from error
    seconds = time.monotonic() - start
    console.info("smoke", "PASS in %.1fs (%d train steps, eval, checkpoint, restore, export)",
                 seconds, SMOKE_STEPS)
    return seconds


def _without_closing_lines(record: logging.LogRecord) -> bool:
    """A console filter: False for a run's closing lines (`ctl.run_end`)."""
    return getattr(record, "ctl_kind", None) != run_end.KIND


def _export_and_compare(task, trainer, directory: ModelDir) -> None:
    features = task.features(next(iter(task.build_inputs(training=False))))
    signatures = task.serving_signatures(trainer.eval_model)
    path = export_saved_model(trainer.eval_model, signatures, directory.file(SMOKE_EXPORT_DIR))
    check_served(signatures, path, features)


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(message)


def _check_close(actual, expected, what: str) -> None:
    """Every result in `expected` (nested for named eval sets) is in `actual`, and matches."""
    actual = flat_logs(actual)
    # The controller's `steps_per_second` is a timing, not a result.
    expected = {k: v for k, v in flat_logs(expected).items() if k != "steps_per_second"}
    missing = sorted(set(expected) - set(actual))
    _check(not missing, f"{what} lack {', '.join(missing)} (got {', '.join(sorted(actual))})")
    for key, value in expected.items():
        np.testing.assert_allclose(np.asarray(actual[key]), np.asarray(value), rtol=1e-4,
                                   atol=1e-6, err_msg=f"{what}: {key}")
