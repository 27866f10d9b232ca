"""`python -m ctl.sweep.trial`: one trial of a sweep, a ctl run with the pruning hook appended.

    python -m ctl.sweep.trial --sweep_file=S.toml --sweep_dir=D [--storage=URL] --trial=N \\
        --mode=train_and_eval --model_dir=M --gin_file=... --gin_bindings=...

ctl.run's flags and path (`ctl.run.main`: its checks, its one-line messages,
its exit statuses, every guarantee of a run), with one hook after the
experiment's own: `ctl.sweep.pruning.PruneAtEvaluations`, which reports the
objective to trial N of the sweep's study at each evaluation and stops the run
there when the pruner says so (exit 0, `sweep_pruned.json` in the model dir).
The study is the one `python -m ctl.sweep` uses: the journal file in `--sweep_dir`,
or `--storage`. A worker starts this (`ctl.sweep.runner`); by hand, the same
command resumes the trial.
"""

from ctl.utils import process_end

if __name__ == "__main__":  # First, so that it runs after every other exit handler.
    process_end.end_after_exit_handlers()

from absl import app, flags  # noqa: E402

from ctl import run as ctl_run  # noqa: E402 - ctl.run's flags, defined on import.
from ctl.utils.errors import UserError, exit_with_error  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("sweep_file", None, "The sweep file (TOML): the objective, the study, the pruner.")
flags.DEFINE_string("sweep_dir", None, "The sweep's directory (its journal file, without --storage).")
flags.DEFINE_string("storage", None, "The study's database, as `python -m ctl.sweep --storage`.")
flags.DEFINE_integer("trial", None, "The trial's number in the study.", lower_bound=0)
for _name in ("sweep_file", "sweep_dir", "trial"):
    flags.mark_flag_as_required(_name)


def main(argv):
    import optuna

    from ctl.sweep import pruning, study, sweep_file

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        sweep = sweep_file.load(FLAGS.sweep_file)
    except UserError as error:
        exit_with_error("ctl.sweep.trial", str(error))
    hook = pruning.PruneAtEvaluations(
        sweep, lambda: study.open_storage(FLAGS.sweep_dir, FLAGS.storage), FLAGS.trial)
    ctl_run.main(argv, hooks=[hook])


if __name__ == "__main__":
    process_end.run(lambda: app.run(main, flags_parser=ctl_run.parse_flags))
