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

from typing import Any, Sequence  # noqa: E402 - after the setting above.

from absl import app, flags  # noqa: E402

import ctl  # noqa: E402
from ctl import command  # noqa: E402
from ctl.cluster import tf_config as cluster  # noqa: E402
from ctl.config import gin_text  # noqa: E402
from ctl.utils.errors import UserError  # noqa: E402
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


COMMAND = "ctl.run"


def _command() -> command.Command:
    return command.Command(COMMAND, verbose=FLAGS["verbosity"].present)


def _fail(message: str) -> None:
    _command().fail(message)


def parse_flags(argv):
    """ctl.run's flags parser: `--gin.NAME=VALUE` expanded, a mistake in one line, exit 2.

    Args:
        argv: the command line, the program name first.
    """
    return command.parse_flags(COMMAND, FLAGS, argv)


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
    command.execute(_command(), [FLAGS.mode], FLAGS.model_dir, FLAGS.cpu_replicas, FLAGS.gin_file,
                    FLAGS.gin_search_paths, command.Setup(FLAGS.strategy, FLAGS.gin_bindings), hooks)


if __name__ == "__main__":
    process_end.run(lambda: app.run(main, flags_parser=parse_flags))
