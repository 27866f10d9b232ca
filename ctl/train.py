"""`python -m ctl.train`: Model Garden's train.py on ctl. Flags, then the experiment, then the mode.

    python -m official.vision.train --experiment=retinanet_resnetfpn_coco --mode=train_and_eval \
        --model_dir=runs/retina --config_file=retina.yaml
    python -m ctl.train --experiment=retinanet_resnetfpn_coco --mode=train_and_eval \
        --model_dir=runs/retina --config_file=retina.yaml

It takes the flags of Model Garden's vision, NLP and ranking train.py (`official.common.flags`:
--experiment, --config_file, --params_override, --mode, --model_dir, --tpu, --tf_data_service,
--gin_file, --gin_params; and --enable_async_checkpointing) and imports Model Garden's registries
itself, up to the one that registers the experiment (vision's first); ctl's own: --strategy
(default: the experiment's `runtime.distribution_strategy`), --cpu_replicas, --gin_bindings. The
experiment's config is built and checked (`ctl.adapters.model_garden_command`), then run as
`ctl.ModelGardenTask` with the experiment's `trainer` and `runtime` settings
(`ctl.adapters.model_garden_settings`). Every mode of Model Garden's open-source train.py runs
(`train_and_validate`, which its train_lib does not run either, is refused);
`--mode=continuous_train_and_eval` fine-tunes from each checkpoint of the directory
`task.init_checkpoint` names, once each, in order (`ctl.sidecar.continuous_finetune`; with
`--pretrain_steps`). TensorFlow is imported only once the flags are checked: `--help` and a flag
mistake answer at once; a mistake ends in one line on stderr, exit status 2.
"""

import os

from ctl.utils import process_end

if __name__ == "__main__":  # First, so that it runs after every other exit handler.
    process_end.end_after_exit_handlers()

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # As ctl.run: warnings and errors only.

from absl import app, flags  # noqa: E402 - after the setting above.

import ctl  # noqa: E402
from ctl import command  # noqa: E402
from ctl.cluster.tf_config import STRATEGIES  # noqa: E402
from ctl.config import gin_text  # noqa: E402
from ctl.utils.errors import UserError  # noqa: E402

FLAGS = flags.FLAGS
COMMAND = "ctl.train"


def define_flags() -> None:
    """Model Garden's train.py flags (`official.common.flags.define_flags`), its
    --enable_async_checkpointing and --pretrain_steps, and ctl's own."""
    from official.common import flags as garden_flags

    garden_flags.define_flags()
    flags.DEFINE_bool("enable_async_checkpointing", True, "Write checkpoints on a background "
                      "thread (ctl.Schedule.async_checkpointing), as Model Garden's train.py.")
    flags.DEFINE_integer("pretrain_steps", None, "--mode=continuous_train_and_eval: the "
                         "pretraining run's last step; the job waits past the timeout until a "
                         "checkpoint of it was fine-tuned.")
    flags.DEFINE_enum("strategy", None, STRATEGIES, "tf.distribute strategy (default: the "
                      "experiment's runtime.distribution_strategy).")
    flags.DEFINE_integer("cpu_replicas", 0, "Split the CPU into N logical devices.")
    flags.DEFINE_multi_string("gin_bindings", [], "Gin binding, applied after the files; repeatable.")
    flags.DEFINE_list("gin_search_paths", [], "Directories to look up gin files and includes in.")
    flags.mark_flags_as_required(["experiment", "mode", "model_dir"])


def _command() -> command.Command:
    return command.Command(COMMAND, verbose=FLAGS["verbosity"].present)


def parse_flags(argv):
    """The flags parser: `--gin.NAME=VALUE` expanded, a mistake in one line, exit 2.

    Args:
        argv: the command line, the program name first.
    """
    return command.parse_flags(COMMAND, FLAGS, argv)


def main(argv):
    """`python -m ctl.train`.

    Args:
        argv: absl's remaining arguments (the program name alone: anything else is an error).
    """
    from ctl.adapters import model_garden_command as garden

    run = _command()
    if len(argv) > 1:
        run.fail(f"unexpected arguments {argv[1:]}; every setting is a --flag.")
    bindings = [line for value in FLAGS.gin_params or [] for line in value.splitlines()]
    bindings += FLAGS.gin_bindings
    try:
        modes = garden.modes(FLAGS.mode)
        gin_text.check(FLAGS.gin_file or [], bindings, FLAGS.gin_search_paths, ctl.__all__)
    except UserError as error:
        run.fail(str(error))

    def setup() -> command.Setup:  # TensorFlow imported, the console set up.
        params, overrides = garden.experiment_params(
            FLAGS.experiment, FLAGS.config_file or [], FLAGS.tpu, FLAGS.tf_data_service,
            FLAGS.params_override)
        own = garden.bindings(FLAGS.experiment, FLAGS.config_file or [], overrides,
                              FLAGS.model_dir, FLAGS.enable_async_checkpointing)
        return command.Setup(garden.strategy(params, FLAGS.strategy), own + bindings,
                             tpu=params.runtime.tpu, finetuning=finetuning(params, overrides))

    def finetuning(params, overrides):
        if FLAGS.mode != garden.CONTINUOUS_FINETUNE:
            return None
        from ctl.sidecar.continuous_finetune import Finetuning

        return Finetuning(garden.watched_directory(params),
                          garden.finetune_bindings(params, overrides),
                          garden.finetune_records(params, FLAGS.model_dir),
                          pretrain_steps=FLAGS.pretrain_steps)

    command.execute(run, modes, FLAGS.model_dir, FLAGS.cpu_replicas, FLAGS.gin_file or [],
                    FLAGS.gin_search_paths, setup, config_in_bindings=True)


if __name__ == "__main__":
    define_flags()
    process_end.run(lambda: app.run(main, flags_parser=parse_flags))
