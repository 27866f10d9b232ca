"""One experiment's export check: ctl's `FinalExporter` on a ctl run of its tiny variant, served.

The tiny variant (the zoo's, on the zoo's generated files, from the zoo's
initial checkpoint) trains K steps under ctl with `ctl.hooks.FinalExporter()`, which exports the final model through
`ctl.ModelGardenTask.serving_signatures` (Model Garden's own export module for
the experiment, where it has one). Then a fresh model is built and restored from
the run's final checkpoint, and the SavedModel, loaded with
`tf.saved_model.load`, must give that model's outputs through the same module
on one eval batch (`ctl.hooks.exporting.check_served`).

`python -m bench.model_garden_zoo.export NAME --steps=K --workdir=DIR` prints
`ZOO-EXPORT {"experiment", "export", "export_signature", "export_reason"}`:
`export` is "serves", "no module" (Model Garden has no export module for the
family: `export_reason` says what ctl did instead) or "fails".
"""

import argparse
import json
import os
import resource
import shutil
import sys
import traceback
from typing import Any, Dict

SERVES, NO_MODULE, FAILS = "serves", "no module", "fails"


def check_export(experiment: str, steps: int, workdir: str) -> Dict[str, Any]:
    """Trains `experiment`'s tiny variant with a `FinalExporter` and checks its SavedModel serves.

    Args:
      experiment: a registered experiment's name.
      steps: training steps (K).
      workdir: for the data (shared with the zoo's rows) and this check's model dir.
    """
    import tensorflow as tf
    import tf_keras

    import ctl
    from bench.model_garden_zoo import compare
    from ctl.adapters import model_garden_serving
    from ctl.hooks import exporting

    row: Dict[str, Any] = {"experiment": experiment, "export": FAILS, "export_reason": ""}
    model_dir = os.path.join(workdir, "runs", experiment.replace("/", "_"), "ctl_export")
    shutil.rmtree(model_dir, ignore_errors=True)
    stage = "building the tiny variant"
    try:
        data_dir = os.path.join(workdir, "data")
        overrides = compare.params_for(experiment, steps, data_dir)
        # Step 0 as the zoo's rows start (no pretrained checkpoint is read), then K steps.
        eval_steps = compare.write_initial_checkpoint(experiment, overrides, [model_dir])
        tf_keras.utils.set_random_seed(1)
        task = ctl.ModelGardenTask(experiment=experiment, params_override=overrides,
                                   logging_dir=model_dir)
        module_class = model_garden_serving.export_module_class(task.params, task.garden_task)
        row["export_module"] = module_class and f"{module_class.__module__}.{module_class.__name__}"
        stage = "training with ctl.hooks.FinalExporter"
        # One loop; its summaries too (the variant's trainer.summary_interval would otherwise
        # apply, and orbit wants it a multiple of the loop).
        schedule = ctl.Schedule(train_steps=steps, steps_per_loop=steps, checkpoint_interval=steps,
                                summary_interval=steps, eval_steps=eval_steps if eval_steps > 0 else None)
        exporter = ctl.hooks.FinalExporter()
        ctl.run_experiment("train", model_dir, experiment=ctl.Experiment(
            task=task, schedule=schedule, hooks=[exporter]))
        path = os.path.join(model_dir, exporting.EXPORT_DIR, "final", str(steps))
        stage = "serving the final checkpoint"
        fresh = ctl.ModelGardenTask(experiment=experiment, params_override=overrides,
                                    logging_dir=model_dir)
        model = fresh.build_model()
        tf.train.Checkpoint(model=model).read(tf.train.latest_checkpoint(model_dir)).expect_partial()
        features = fresh.features(next(iter(fresh.build_inputs(training=False))))
        signatures = fresh.serving_signatures(model)
        served = exporting.check_served(signatures, path, features)
        row["export_signature"] = {name: sorted(outputs) for name, outputs in served.items()}
        row["export"] = SERVES if module_class else NO_MODULE
        if not module_class:
            row["export_reason"] = ("Model Garden has no export module for "
                                    f"{type(task.params.task).__name__}: served from the model's "
                                    "Keras inputs")
    except ctl.UserError as error:
        no_module = "has no export module" in str(error)
        row["export"] = NO_MODULE if no_module else FAILS
        row["export_reason"] = f"{stage}: {error}" if not no_module else str(error)
        traceback.print_exc()
    except Exception as error:  # The row says why, in a line a user can check.
        row["export_reason"] = f"{stage}: {type(error).__name__}: {compare._message(error)[:300]}"
        traceback.print_exc()
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("experiment")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--workdir", required=True)
    args = parser.parse_args(argv)
    from bench.model_garden_zoo import registry

    registry.import_all()
    row = check_export(args.experiment, args.steps, args.workdir)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    row["export_cpu_s"] = round(usage.ru_utime + usage.ru_stime, 1)
    print("ZOO-EXPORT " + json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
