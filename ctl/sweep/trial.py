"""`python -m ctl.sweep.trial`: one trial of a sweep, a ctl run with the pruning hook appended.

    python -m ctl.sweep.trial --sweep_file=S.toml --sweep_dir=D [--storage=URL] --trial=N \\
        --mode=train_and_eval --model_dir=M --gin_file=... --gin_bindings=...

ctl.run's flags and path (`ctl.run.main`: its checks, its one-line messages,
its exit statuses, every guarantee of a run), with hooks after the
experiment's own: with the sweep file's `value = "best"`, `ctl.hooks.BestCheckpoint`
by the objective (the checkpoint of the trial's value, in `<model_dir>/best/`;
not added twice if the experiment has the same), then
`ctl.sweep.pruning.PruneAtEvaluations`, which reports the
objective to trial N of the sweep's study at each evaluation and stops the run
there when the pruner says so (exit 0, `sweep_pruned.json` in the model dir).
A run that fails (exit 1 or 2) still gets its HParams summary, with state
`failed` (`ctl.hooks.hparams`), so that TensorBoard lists every trial.
The study is the one `python -m ctl.sweep` uses: the journal file in `--sweep_dir`,
or `--storage`. A worker starts this (`ctl.sweep.runner`); by hand, the same
command resumes the trial.
"""

from ctl.utils import process_end

if __name__ == "__main__":  # First, so that it runs after every other exit handler.
    process_end.end_after_exit_handlers()

from absl import app, flags

from ctl import run as ctl_run  # ctl.run's flags, defined on import.
from ctl.utils.errors import UserError, exit_with_error

FLAGS = flags.FLAGS
flags.DEFINE_string("sweep_file", None, "The sweep file (TOML): the objective, the study, the pruner.")
flags.DEFINE_string("sweep_dir", None, "The sweep's directory (its journal file, without --storage).")
flags.DEFINE_string("storage", None, "The study's database, as `python -m ctl.sweep --storage`.")
flags.DEFINE_integer("trial", None, "The trial's number in the study.", lower_bound=0)


def main(argv):
    """`python -m ctl.sweep.trial`: ctl.run's path, with the trial's pruning hook.

    Args:
        argv: absl's remaining arguments.
    """
    import optuna

    from ctl.sweep import pruning, sweep_file
    from ctl.sweep.storage import open_storage

    for name in ("sweep_file", "sweep_dir", "trial"):  # Not absl's validators: see ctl.sweep.__main__.main.
        if FLAGS[name].value is None:
            exit_with_error("ctl.sweep.trial", f"--{name} is required: {FLAGS[name].help}")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        sweep = sweep_file.load(FLAGS.sweep_file)
    except UserError as error:
        exit_with_error("ctl.sweep.trial", str(error))
    hooks = [pruning.PruneAtEvaluations(
        sweep, lambda: open_storage(FLAGS.sweep_dir, FLAGS.storage), FLAGS.trial)]
    if sweep.value == "best":  # The checkpoint of the evaluation that is the trial's value.
        from ctl.hooks import BestCheckpoint

        hooks.insert(0, BestCheckpoint(sweep.objective, higher_is_better=sweep.maximize))
    from ctl.hooks import hparams

    hparams.END_STATE = lambda run: "pruned" if pruning.read_pruned(run.directory) else None
    try:
        ctl_run.main(argv, hooks=hooks)
    except SystemExit as end:
        if end.code in FAILED:
            _failed_summary()
        raise
    except Exception:
        _failed_summary()
        raise


FAILED = (1, 2)  # A bug, a user error: the statuses of a run that failed (not stopped, not killed).


def _failed_summary() -> None:
    """The HParams summary of a failed trial (`ctl.hooks.hparams`, state `failed`): the gin
    values parsed (else the command's bindings) and the last step on record. Best effort: the
    run's own failure is what the trial ends with."""
    import ast

    import gin

    from ctl.hooks import hparams
    from ctl.config import gin_config as config
    from ctl.model_dir import ModelDir

    try:
        values = config.operative_values(gin.config_str())
        if not values:
            values = {}
            for binding in FLAGS.gin_bindings:
                name, _, text = binding.partition("=")
                try:
                    values[name.strip()] = ast.literal_eval(text.strip())
                except (ValueError, SyntaxError):
                    values[name.strip()] = text.strip()
        steps = [r.get("step") for r in ModelDir(FLAGS.model_dir).metrics()]
        steps = [s for s in steps if isinstance(s, int)]
        hparams.write_summary(FLAGS.model_dir, values, "failed", max(steps, default=0))
    except Exception as error:  # noqa: BLE001 - never hide the run's own failure.
        print(f"ctl.sweep.trial: no HParams summary of the failed trial ({error})", flush=True)


if __name__ == "__main__":
    process_end.run(lambda: app.run(main, flags_parser=ctl_run.parse_flags))
