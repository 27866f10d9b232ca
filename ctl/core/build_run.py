"""Where every mode's Trainer is built: `build_run` makes the Trainer and binds the run's hooks to it.

One wiring for train, eval and train_and_eval (`ctl.train_lib`), the sidecar evaluator
(`ctl.sidecar.continuous_eval`) and smoke's fresh trainer (`ctl.smoke`), so that the hooks see
the same `Run` (`ctl.core.hook_protocol`) everywhere.
"""

from typing import Any, Iterable, Tuple

import tensorflow as tf

from ctl.core.hook_protocol import Hooks, Run, eval_callbacks
from ctl.model_dir import ModelDir


def build_run(experiment, strategy: tf.distribute.Strategy, directory: ModelDir, *,
              train: bool, evaluate: bool, chief: bool = True, stop: Any = None,
              guard_steps: bool = True, builtin: Iterable[Any] = (),
              sidecar: bool = False) -> Tuple[Any, Hooks]:
    """Builds a run's Trainer and binds its hooks to it: the one wiring of every mode
    (train, eval and train_and_eval in `ctl.train_lib`, the sidecar, smoke's fresh trainer).

    The Trainer's `run_seed` is the experiment's `ctl.FaultTolerance.seed` (the process is seeded
    with it before): an eval step that draws from stateful random ops is then traced anew for
    each evaluation (`ctl.core.evaluation`).

    The hooks see the same `Run` everywhere: `model` the Trainer's model,
    `eval_model` its evaluated one, `checkpoint` the evaluated state.

    Args:
      experiment: the run's `ctl.Experiment`: its `trainer_cls` (given its `trainer_args`), `task`
        and `hooks` (whose Keras callbacks every evaluation calls).
      strategy: the strategy to build under.
      directory: the run's model dir (`Run.directory`).
      train: the Trainer builds the train input.
      evaluate: the Trainer builds the eval inputs.
      chief: this process writes the model dir (`Run.chief`).
      stop: the Trainer's stop source while training (`ctl.core.stop.SignalWatcher`), or None.
      guard_steps: with a `stop`, train loops look at it before every step.
      builtin: ctl's own hooks, bound before the experiment's.
      sidecar: a sidecar evaluator, which restores only the model (and its moving
        average): `Run.checkpoint` then holds the evaluated model and the step (and the
        task's `checkpoint_items`), not an optimizer it never reads.

    Returns:
      The Trainer, and the bound `Hooks` (their `Run` is `hooks.run`).
    """
    trainer = experiment.trainer_cls(
        experiment.task, strategy=strategy, train=train, evaluate=evaluate, stop=stop,
        guard_steps=guard_steps, eval_callbacks=eval_callbacks(experiment.hooks),
        **getattr(experiment, "trainer_args", {}))
    # Seeded, an eval step that draws from stateful random ops is traced anew for each
    # evaluation (`ctl.core.evaluation`), which seeding the process alone does not do.
    fault_tolerance = getattr(experiment, "fault_tolerance", None)
    trainer.run_seed = getattr(fault_tolerance, "seed", None)
    if getattr(fault_tolerance, "stateless_random_ops", False):  # Checked: with a seed.
        trainer.step_random_seed = fault_tolerance.seed
    # The sidecar's best checkpoint holds the task's items too (parts of the evaluated model,
    # unless that is the moving average).
    items = getattr(trainer, "checkpoint_items", {}) if trainer.eval_model is trainer.model else {}
    checkpoint = (tf.train.Checkpoint(model=trainer.eval_model, global_step=trainer.global_step,
                                      **items)
                  if sidecar else trainer.eval_checkpoint)
    run = Run(directory=directory, model=trainer.model, eval_model=trainer.eval_model,
              checkpoint=checkpoint, global_step=trainer.global_step, task=experiment.task,
              strategy=strategy, chief=chief)
    return trainer, Hooks(experiment.hooks, run, builtin=builtin)
