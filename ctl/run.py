"""`python -m ctl.run`: flags, then gin, then the mode. Intentionally short.

    python -m ctl.run --mode=train_and_eval --model_dir=/tmp/digits \
        --gin_file=configs/digits.gin --gin.ctl.Schedule.train_steps=500

`--gin.NAME=VALUE` is short for `--gin_bindings='NAME=VALUE'`. The same command runs on every
task of a cluster (the role comes from TF_CONFIG, `ctl.cluster.tf_config`). TensorFlow is
imported only once the flags and the gin text are checked (`ctl.config.gin_text`), so `--help`, a
flag mistake and a gin syntax error answer at once. A user's mistake ends in one line on stderr
and exit status 2; the other exit statuses (75 preempted, 69 a lost peer, 74 a storage fault)
are in docs/reference/exit-statuses.md. ctl's lines go through `ctl.utils.console`;
TensorFlow's, orbit's and absl's INFO lines show with `--verbosity=0`.

A program that runs a ctl run with a hook of its own (`python -m ctl.sweep.trial`) calls
`app.run(lambda argv: main(argv, hooks=[...]), flags_parser=parse_flags)`.
"""

import os

from ctl.utils import process_end

if __name__ == "__main__":  # First, so that it runs after every other exit handler.
    process_end.end_after_exit_handlers()

# TensorFlow's C++ INFO lines (oneDNN notices, end-of-sequence rendezvous) drown the
# loop's own log: this command keeps warnings and errors. Set before TensorFlow is
# imported; a value the user set wins. (`import ctl` leaves the process's setting alone.)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import logging as std_logging  # noqa: E402 - after the setting above.
import sys  # noqa: E402
from typing import Any, Sequence  # noqa: E402

from absl import app, flags, logging  # noqa: E402

import ctl  # noqa: E402
from ctl.cluster import tf_config as cluster  # noqa: E402
from ctl.utils import console  # noqa: E402
from ctl.config import gin_text  # noqa: E402
from ctl.utils.errors import EXIT_USER_ERROR, UserError, first_line  # noqa: E402
from ctl.cluster import run_plan  # noqa: E402
from ctl.cluster.run_plan import MODES, SMOKE  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_enum("mode", None, MODES + (SMOKE,),
                  "What to run; `smoke` rehearses a run in seconds in a temporary dir.")
flags.DEFINE_string("model_dir", None, "Directory for checkpoints, summaries and configs.")
flags.DEFINE_multi_string("gin_file", [], "Gin config file; repeat to parse several in order.")
flags.DEFINE_multi_string("gin_bindings", [], "Gin binding, applied after the files; repeatable.")
flags.DEFINE_list("gin_search_paths", [], "Directories to look up gin files and includes in.")
flags.DEFINE_enum("strategy", "default", cluster.STRATEGIES, "tf.distribute strategy.")
flags.DEFINE_integer("cpu_replicas", 0, "Split the CPU into N logical devices (try mirrored on CPU).")
flags.mark_flag_as_required("mode")


def _fail(message: str) -> None:
    _exit(EXIT_USER_ERROR, f"error: {message}")


def _exit(status: int, message: str) -> None:
    """The last line, on stderr and on a line of its own (the live bar cleared for good)."""
    console.end_bar()
    print(f"ctl.run: {message}", file=sys.stderr)
    sys.exit(status)


def parse_flags(argv):
    """ctl.run's flags parser: `--gin.NAME=VALUE` expanded, a mistake in one line, exit 2.

    Args:
        argv: the command line, the program name first.
    """
    try:
        return FLAGS(gin_text.expand_gin_flags(argv))
    except flags.Error as error:
        _fail(f"{error}. See --helpfull.")
    except UserError as error:
        _fail(str(error))


def _set_up_console() -> None:
    """ctl's lines on the console; libraries' INFO lines only if `--verbosity` asks.

    Library log lines go to stdout too, so that stderr holds only problems.
    """
    if not FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)
    logging.get_absl_handler().python_handler.stream = sys.stdout
    console.install(sys.stdout)
    # TensorFlow's Python logger writes to stderr with a handler of its own;
    # without it, its lines reach the absl handler above, on stdout.
    tf_logger = std_logging.getLogger("tensorflow")
    for tf_handler in list(tf_logger.handlers):
        tf_logger.removeHandler(tf_handler)


def _say_strategy(name: str, strategy) -> None:
    try:
        devices = " on " + ", ".join(strategy.extended.worker_devices)
    except RuntimeError:  # The default strategy names no devices.
        devices = ""
    console.info("setup", "--strategy=%s: %d replica(s)%s", name,
                 strategy.num_replicas_in_sync, devices)


def main(argv, hooks: Sequence[Any] = ()):
    """`python -m ctl.run`; `hooks` run after the experiment's (`ctl.train_lib.run_experiment`).

    Args:
        argv: absl's remaining arguments (the program name alone: anything else is an error).
        hooks: hooks run after the experiment's own.
    """
    if len(argv) > 1:
        _fail(f"unexpected arguments {argv[1:]}; every setting is a --flag or a gin binding.")
    if not FLAGS.model_dir and FLAGS.mode != SMOKE:
        _fail(f"--mode={FLAGS.mode} needs --model_dir; name the run's directory.")
    try:
        gin_text.check(FLAGS.gin_file, FLAGS.gin_bindings, FLAGS.gin_search_paths, ctl.__all__)
    except UserError as error:
        _fail(str(error))
    _run(hooks)
    from ctl.core import stop  # TensorFlow is imported by now.
    stop.exit_0_on_a_late_signal()  # The run is done.


def _run(hooks: Sequence[Any]) -> None:
    """Everything after the checks: TensorFlow is imported here."""
    from ctl.utils import devices

    devices.list_devices()  # First: without the CUDA wheel's cuInit line on a host with no GPU.
    from ctl import smoke, train_lib
    from ctl.cluster import distribute, peers
    from ctl.config import gin_config as config
    from ctl.model_dir import ModelDir
    from ctl.core.stop import EXIT_PREEMPTED
    from ctl.faults.preemption import Preempted
    from ctl.faults.storage import EXIT_STORAGE_FAULT, storage_fault_within
    from ctl.sidecar import continuous_eval
    from ctl.sidecar.scheduler import ContinuousEval

    _set_up_console()
    ctl.import_api()  # A gin file may bind any `ctl.` configurable.
    directory = ModelDir(FLAGS.model_dir) if FLAGS.model_dir else None  # The run's, once.
    try:
        plan = run_plan.plan(FLAGS.mode, FLAGS.strategy, cluster.read_tf_config())  # Once.
        if plan.mode != FLAGS.mode:
            console.warning("setup", "TF_CONFIG names this task the %s: running --mode=%s, not "
                            "--mode=%s.", plan.cluster.task_type, plan.mode, FLAGS.mode)
        gin_files = FLAGS.gin_file
        if plan.sidecar and not gin_files:  # The trainer's config.
            timeout = config.query_bindings_only(FLAGS.gin_bindings, "ctl.ContinuousEval.timeout",
                                                 ContinuousEval.timeout)
            ContinuousEval(timeout=timeout)  # Checks it.
            gin_files = [continuous_eval.wait_for_config(directory, timeout)]
        if plan.serve:
            config.parse(gin_files, FLAGS.gin_bindings, FLAGS.gin_search_paths)
            distribute.serve(plan.cluster)  # Until the cluster manager stops it.
            return
        strategy = distribute.create_strategy(plan.strategy, FLAGS.cpu_replicas, plan.cluster)
        _say_strategy(plan.strategy, strategy)
        config.parse(gin_files, FLAGS.gin_bindings, FLAGS.gin_search_paths)
        if plan.mode == SMOKE:
            smoke.run_smoke(strategy)
        else:
            with peers.reported_as_peer_loss(plan.cluster), peers.watched(plan.cluster, plan.strategy):
                train_lib.run_experiment(plan, directory, strategy, hooks=hooks)
    except Preempted as preempted:
        _exit(EXIT_PREEMPTED, f"preempted: {preempted}")
    except continuous_eval.Stopped as stopped:
        _exit(EXIT_PREEMPTED, f"stopped: {stopped}")
    except peers.PeerLost as lost:
        _exit(peers.EXIT_PEER_LOST, f"peer lost: {lost}")
    except UserError as error:
        # Gin appends "In call to configurable ..." lines; the first line is ctl's.
        _fail(first_line(error, None))
    except Exception as error:  # Only a storage fault is handled here.
        fault = storage_fault_within(error, directory)
        if fault is None:
            raise  # A bug keeps its traceback.
        _exit(EXIT_STORAGE_FAULT, f"storage error: {fault.message(directory)}")


if __name__ == "__main__":
    process_end.run(lambda: app.run(main, flags_parser=parse_flags))
