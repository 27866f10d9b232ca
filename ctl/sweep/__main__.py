"""`python -m ctl.sweep`: a hyperparameter sweep over gin bindings, each trial a ctl run.

    python -m ctl.sweep --gin_file=configs/digits.gin --sweep_file=configs/digits_sweep.toml \
        --sweep_dir=runs/digits_sweep [--workers=2] [--storage=postgresql://...] [--gin_bindings=...] \
        [--trials_dir=gs://BUCKET/sweeps/digits]

The sweep file, the gin config and `--trials_dir` are checked first
(`ctl.sweep.sweep_file`, `ctl.sweep.sweep_dir`): a mistake ends in one line on
stderr and exit status 2, before any trial. Then the study is opened or
created (`ctl.sweep.study`) and `--workers` processes take its trials
(`ctl.sweep.worker`). Run the same command again to resume a sweep (after a
crash, a kill -9, a reboot); on another machine, with the same `--storage`, to
add workers. With `--trials_dir`, the trials' model dirs are
`<trials_dir>/<number>/` (a bucket: every machine reaches them).

Ctrl-C at a terminal (SIGINT to the foreground process group), SIGTERM to the
group or to this process alone: each process below this one is a session of
its own (the workers, the trials), so the signal reaches this process only; it
passes it on once, each worker passes one SIGTERM to its trial, which saves a
checkpoint and stays RUNNING in the study; the command ends with one line and
status 75, and the same command resumes every stopped trial. Without Optuna
installed: one line naming the extra.
"""

from ctl.utils import process_end

if __name__ == "__main__":  # First, so that it runs after every other exit handler.
    process_end.end_after_exit_handlers()

import os
import signal
import subprocess
import sys

from absl import app, flags

from ctl.utils.errors import UserError, exit_with_error, first_line, flags_parser

EXIT_PREEMPTED = 75  # ctl.core.stop.EXIT_PREEMPTED, without importing TensorFlow.

FLAGS = flags.FLAGS


def define_flags() -> None:
    """The command's flags: defined when it runs, not on import, so that a process that imported
    `ctl.run` (whose flags have the same names) may import this module."""
    flags.DEFINE_multi_string("gin_file", [], "The trials' gin file; repeat to parse several in order.")
    flags.DEFINE_multi_string("gin_bindings", [], "A gin binding of every trial (before the sampled ones).")
    flags.DEFINE_list("gin_search_paths", [], "Directories to look up gin files and includes in.")
    flags.DEFINE_string("sweep_file", None, "The sweep file (TOML): objective, budget, sampler, pruner, space.")
    flags.DEFINE_string("sweep_dir", None, "The sweep's directory: trials/<number>/ model dirs, the study.")
    flags.DEFINE_integer("workers", 1, "Worker processes on this machine, each running one trial at a time.",
                         lower_bound=1)
    flags.DEFINE_string("trials_dir", None, "Where the trials' model dirs go, <trials_dir>/<number>/, "
                        "e.g. gs://BUCKET/sweeps/NAME (default: <sweep_dir>/trials); the study and the "
                        "logs stay in --sweep_dir or --storage.")
    flags.DEFINE_string("storage", None, "The study's database, e.g. postgresql://USER@HOST:PORT/DB "
                        "(default: a journal file in --sweep_dir).")
    flags.DEFINE_float("heartbeat_seconds", 10.0, "How often a worker renews its running trial's heartbeat.",
                       lower_bound=0.1)
    flags.DEFINE_float("grace_seconds", 60.0, "A running trial whose heartbeat is this old is taken over.",
                       lower_bound=0.1)
    flags.DEFINE_bool("fork_trials", True, "Fork each trial from a process per worker that has imported "
                      "TensorFlow and ctl (Linux; elsewhere, and with false, a new process per trial).")
    flags.DEFINE_bool("as_worker", False, "Internal: run as one of --workers (the checks were done).")



def _fail(message: str) -> None:
    exit_with_error("ctl.sweep", message)


def main(argv):
    """`python -m ctl.sweep`: checks the flags and the sweep file, then runs the workers.

    Args:
        argv: absl's remaining arguments (the program name alone: anything else is an error).
    """
    if len(argv) > 1:
        _fail(f"unexpected arguments {argv[1:]}; every setting is a --flag.")
    # Checked here, not by absl's validators: those would bind every program that defines these
    # flags, not only `python -m ctl.sweep`.
    for name in ("sweep_file", "sweep_dir"):
        if FLAGS[name].value is None:
            _fail(f"--{name} is required: {FLAGS[name].help}")
    try:
        import optuna  # noqa: F401
    except ImportError:
        _fail("ctl.sweep runs on Optuna, which is not installed: pip install -e '.[sweep]' "
              "in ctl's checkout.")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    try:
        status = _sweep()
    except UserError as error:
        _fail(str(error))
    if status == EXIT_PREEMPTED and not FLAGS.as_worker:
        print("ctl.sweep: stopped: each running trial saved a checkpoint and stays in the study; "
              "run the same command again to resume them.", file=sys.stderr)
    sys.exit(status)


def _sweep() -> int:
    if FLAGS.as_worker:  # Its model dir code imports TensorFlow: first, without the cuInit line.
        from ctl.utils import devices

        devices.list_devices()
    import optuna

    from ctl.sweep import pruning, study, sweep_file
    from ctl.sweep.storage import open_storage, without_password, write_record
    from ctl.sweep.sweep_dir import trials_path

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sweep = sweep_file.load(FLAGS.sweep_file)
    sweep_dir = os.path.abspath(FLAGS.sweep_dir)
    if not FLAGS.as_worker:
        study.check_existing(sweep_dir, FLAGS.storage, sweep)  # A changed file: at once.
        _check(sweep)
    storage = open_storage(sweep_dir, FLAGS.storage)
    try:
        opened = study.Study(storage, sweep, pruning.make_pruner(sweep.pruner),
                             sweep_dir=sweep_dir)
    except UserError:
        raise
    except Exception as error:  # The database's errors, whatever the driver.
        raise UserError(f"cannot open the study {sweep.study!r} in "
                        f"{without_password(FLAGS.storage or sweep_dir)} ({first_line(error)})"
                        "; check --storage.") from error
    if FLAGS.as_worker:
        return _work(opened, sweep, sweep_dir)
    if FLAGS.workers == 1:
        status = _work(opened, sweep, sweep_dir)
    else:
        write_record(sweep_dir, sweep, FLAGS.storage, trials_path(FLAGS.trials_dir))
        status = _supervise(FLAGS.workers)
    return _end(opened, sweep, sweep_dir) if status == 0 else status


def _check(sweep) -> None:
    """The gin text, then the space against the config, then --trials_dir (TensorFlow is
    imported here)."""
    import ctl
    from ctl.config import gin_text
    from ctl.utils import devices
    from ctl.sweep import sweep_dir, sweep_file

    devices.list_devices()  # Without the CUDA wheel's cuInit line on a host with no GPU.
    gin_text.check(FLAGS.gin_file, FLAGS.gin_bindings, FLAGS.gin_search_paths, ctl.__all__)
    sweep_file.check_against_config(sweep, FLAGS.gin_file, FLAGS.gin_bindings,
                                    FLAGS.gin_search_paths)
    if FLAGS.trials_dir:
        sweep_dir.check_trials_dir(FLAGS.trials_dir)


def _work(opened, sweep, sweep_dir: str) -> int:
    from ctl.model_dir.sweep_workers import take_slot
    from ctl.sweep import progress, worker
    from ctl.sweep.storage import write_record
    from ctl.sweep.sweep_dir import trials_path

    trials_dir = trials_path(FLAGS.trials_dir)
    write_record(sweep_dir, sweep, FLAGS.storage, trials_dir)
    slot = take_slot(sweep_dir)
    one = worker.Worker(opened, sweep, sweep_dir, slot, FLAGS.gin_file, FLAGS.gin_bindings,
                        FLAGS.gin_search_paths, FLAGS.heartbeat_seconds, FLAGS.grace_seconds,
                        FLAGS.storage, trials_dir, fork_trials=FLAGS.fork_trials and worker.FORKS)
    one.install_signals()
    one.say(f"study {sweep.study!r}: {progress.line(opened, sweep.objective)}")
    return one.run()


def _end(opened, sweep, sweep_dir: str) -> int:
    """Once the workers ended with 0 (the budget spent, or the timeout): the sweep's last lines,
    printed once, and its status: 0, or EXIT_ALL_FAILED when no trial ended but failed."""
    from ctl.sweep import progress

    counts = opened.counts()
    progress.say(f"sweep | done: {progress.line(opened, sweep.objective)}")
    if counts["fail"] and not counts["complete"] and not counts["pruned"]:
        first = min(opened.trials((progress.FAILED,)), key=lambda t: t.number)
        print(f"ctl.sweep: error: every trial that ended failed ({counts['fail']}); trial "
              f"{first.number}: {first.user_attrs.get('fail_reason', 'no reason recorded')}; fix "
              f"what it says, then run the sweep with a new --sweep_dir (or study name).",
              file=sys.stderr, flush=True)
        return progress.EXIT_ALL_FAILED
    print(f"sweep | to look: python -m ctl.report --model_dir={sweep_dir} ; "
          f"tensorboard --logdir {sweep_dir}", flush=True)
    return 0


def _supervise(workers: int) -> int:
    """Starts `workers` worker processes (this command with --as_worker), each a session of
    its own, passes SIGTERM and SIGINT on to them, and exits 75 if one was stopped, else with
    the worst status."""
    from ctl.sweep.launcher import die_with_parent

    argv = [sys.executable, "-m", "ctl.sweep", *sys.argv[1:], "--as_worker", "--workers=1"]
    children = [subprocess.Popen(argv, start_new_session=True,
                                 preexec_fn=lambda: die_with_parent(signal.SIGTERM))
                for _ in range(workers)]

    def forward(signum, unused_frame):
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, forward)
    statuses = [child.wait() for child in children]
    if EXIT_PREEMPTED in statuses:
        return EXIT_PREEMPTED
    return max(statuses, key=abs)


if __name__ == "__main__":
    define_flags()
    process_end.run(lambda: app.run(main, flags_parser=flags_parser("ctl.sweep", FLAGS)))
