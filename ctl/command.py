"""The run path `python -m ctl.run` and `python -m ctl.train` share once their flags are read:
the console, the strategy, gin, the mode, and the exit statuses.

    command.execute(Command("ctl.run", verbose=False), mode="train_and_eval", model_dir="/tmp/r",
                    strategy="default", gin_files=[...], gin_bindings=[...])

TensorFlow is imported inside `execute`, after the entry point checked its flags and the gin
text. A user's mistake ends in one line on stderr, `<command>: error: ...`, and exit status 2;
the other exit statuses (75 preempted, 69 a lost peer, 74 a storage fault) are in
docs/reference/exit-statuses.md.
"""

import dataclasses
import logging as std_logging
import sys
from typing import Any, Callable, Dict, Optional, Sequence, Union

from absl import flags, logging

from ctl.cluster import run_plan
from ctl.cluster import tf_config as cluster
from ctl.cluster.run_plan import SMOKE
from ctl.config import gin_text
from ctl.utils import console
from ctl.utils.errors import EXIT_USER_ERROR, UserError, first_line


@dataclasses.dataclass(frozen=True)
class Command:
    """Which command runs, for its messages and its console.

    Args:
        name: the command as its last line names it, e.g. "ctl.run".
        verbose: `--verbosity` was given: libraries' INFO lines show.
    """

    name: str
    verbose: bool = False

    def fail(self, message: str) -> None:
        """Ends the process: one line `<name>: error: <message>` on stderr, exit status 2.

        Args:
            message: the problem and its fix.
        """
        self.exit(EXIT_USER_ERROR, f"error: {message}")

    def exit(self, status: int, message: str) -> None:
        """The last line, on stderr and on a line of its own (the live bar cleared for good).

        Args:
            status: the exit status.
            message: the line after `<name>: `.
        """
        console.end_bar()
        print(f"{self.name}: {message}", file=sys.stderr)
        sys.exit(status)


def parse_flags(name: str, flag_values, argv):
    """An entry point's flags parser: `--gin.NAME=VALUE` expanded, a mistake in one line, exit 2.

    Args:
        name: the command, as its error line names it (e.g. "ctl.run").
        flag_values: the absl `FlagValues` that hold the command's flags.
        argv: the command line, the program name first.
    """
    try:
        return flag_values(gin_text.expand_gin_flags(argv))
    except flags.Error as error:
        Command(name).fail(f"{error}. See --helpfull.".replace("\n", "; "))
    except UserError as error:
        Command(name).fail(str(error))


@dataclasses.dataclass(frozen=True)
class Setup:
    """What a run needs beyond its mode, model dir and gin files.

    Args:
        strategy: the strategy's name (one of `ctl.cluster.tf_config.STRATEGIES`).
        gin_bindings: gin bindings, applied after the files.
        tpu: the TPU to connect to under the `tpu` strategy (None: the environment's).
        finetuning: fine-tune from each checkpoint of another run, each fine-tune the one mode
            given (`ctl.sidecar.continuous_finetune.Finetuning`: `ctl.train`'s
            `--mode=continuous_train_and_eval`); None: run the modes once.
    """

    strategy: str
    gin_bindings: Sequence[str]
    tpu: Optional[str] = None
    finetuning: Optional[Any] = None


def set_up_console(verbose: bool) -> None:
    """ctl's lines on the console; libraries' INFO lines only if `--verbosity` asks.

    Library log lines go to stdout too, so that stderr holds only problems.

    Args:
        verbose: `--verbosity` was given.
    """
    if not verbose:
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


def execute(command: Command, modes: Sequence[str], model_dir: Optional[str], cpu_replicas: int,
            gin_files: Sequence[str], search_paths: Sequence[str],
            setup: Union[Setup, Callable[[], Setup]], hooks: Sequence[Any] = (), *,
            config_in_bindings: bool = False) -> None:
    """Runs `modes` one after the other (each one of `ctl.MODES`, or `smoke`), or with
    `Setup.finetuning` the one mode once per fine-tune, then ends a late signal's wait; a
    mistake, a preemption, a lost peer or a storage fault ends the process.

    Args:
        command: the command, for its messages.
        modes: what to run, in order (`ctl.train`'s `train_and_post_eval` is train, then eval).
        model_dir: `--model_dir` (None only for smoke).
        cpu_replicas: split the CPU into this many logical devices (0: do not).
        gin_files: gin files, parsed in order.
        search_paths: where gin looks for files and includes.
        setup: the strategy and the bindings, or what makes them once TensorFlow is imported and
            the console set up (`ctl.train` reads the experiment's config there; its `UserError`
            ends in one line).
        hooks: hooks run after the experiment's own.
        config_in_bindings: the bindings hold the whole experiment (`ctl.train`'s): a sidecar
            does not wait for the trainer's config.gin.
    """
    from ctl.utils import devices

    devices.list_devices()  # First: without the CUDA wheel's cuInit line on a host with no GPU.
    import ctl
    from ctl import smoke, train_lib
    from ctl.cluster import distribute, peers
    from ctl.config import gin_config as config
    from ctl.core.stop import EXIT_PREEMPTED, exit_0_on_a_late_signal
    from ctl.faults.preemption import Preempted
    from ctl.faults.storage import EXIT_STORAGE_FAULT, storage_fault_within
    from ctl.model_dir import ModelDir
    from ctl.sidecar import continuous_eval
    from ctl.sidecar.scheduler import ContinuousEval

    set_up_console(command.verbose)
    ctl.import_api()  # A gin file may bind any `ctl.` configurable.
    directory = ModelDir(model_dir) if model_dir else None  # The run's, once.
    try:
        if callable(setup):
            setup = setup()
        gin_bindings = setup.gin_bindings
        config_tf = cluster.read_tf_config()  # Once.
        plans = [run_plan.plan(mode, setup.strategy, config_tf) for mode in modes]
        for plan, mode in zip(plans, modes):
            if plan.mode != mode:
                console.warning("setup", "TF_CONFIG names this task the %s: running --mode=%s, not "
                                "--mode=%s.", plan.cluster.task_type, plan.mode, mode)
        plans = plans[:1] if plans[0].mode != modes[0] else plans
        if setup.finetuning is not None and plans[0].cluster is not None:
            raise UserError("--mode=continuous_train_and_eval runs in one process, and TF_CONFIG "
                            "names a cluster; unset TF_CONFIG (--strategy=mirrored uses every GPU "
                            "of the host).")
        gin_files = list(gin_files)
        if plans[0].sidecar and not gin_files and not config_in_bindings:  # The trainer's config.
            timeout = config.query_bindings_only(gin_bindings, "ctl.ContinuousEval.timeout",
                                                 ContinuousEval.timeout)
            ContinuousEval(timeout=timeout)  # Checks it.
            gin_files = [continuous_eval.wait_for_config(directory, timeout)]
        if plans[0].serve:
            config.parse(gin_files, gin_bindings, search_paths)
            distribute.serve(plans[0].cluster)  # Until the cluster manager stops it.
            return
        created = distribute.create_strategy(plans[0].strategy, cpu_replicas, plans[0].cluster,
                                             tpu=setup.tpu)
        _say_strategy(plans[0].strategy, created)
        config.parse(gin_files, gin_bindings, search_paths)
        if setup.finetuning is not None:
            _finetune_continuously(setup.finetuning, plans[0], directory, created, gin_files,
                                   gin_bindings, search_paths, hooks)
        else:
            for plan in plans:
                if plan.mode == SMOKE:
                    smoke.run_smoke(created)
                    continue
                with peers.reported_as_peer_loss(plan.cluster), peers.watched(plan.cluster,
                                                                               plan.strategy):
                    train_lib.run_experiment(plan, directory, created, hooks=hooks)
    except Preempted as preempted:
        command.exit(EXIT_PREEMPTED, f"preempted: {preempted}")
    except continuous_eval.Stopped as stopped:
        command.exit(EXIT_PREEMPTED, f"stopped: {stopped}")
    except peers.PeerLost as lost:
        command.exit(peers.EXIT_PEER_LOST, f"peer lost: {lost}")
    except UserError as error:
        # Gin appends "In call to configurable ..." lines; the first line is ctl's.
        command.fail(first_line(error, None))
    except Exception as error:  # Only a storage fault is handled here.
        fault = storage_fault_within(error, directory)
        if fault is None:
            raise  # A bug keeps its traceback.
        command.exit(EXIT_STORAGE_FAULT, f"storage error: {fault.message(directory)}")
    exit_0_on_a_late_signal()  # The run is done.


def _finetune_continuously(finetuning, plan, directory, strategy, gin_files: Sequence[str],
                           gin_bindings: Sequence[str], search_paths: Sequence[str],
                           hooks: Sequence[Any]) -> None:
    """Each fine-tune of `finetuning` (`ctl.sidecar.continuous_finetune`): `plan`'s mode in its own
    model dir, under gin parsed again with its bindings after the run's."""
    import gin

    from ctl import train_lib
    from ctl.config import gin_config as config
    from ctl.experiment import Experiment
    from ctl.sidecar import continuous_finetune
    from ctl.sidecar.scheduler import ContinuousEval

    # The experiment as the run's config makes it, once before any wait: a mistake in it ends
    # the job at once, and its settings are the watcher's (the experiment's timeout).
    experiment = config.call_configured(Experiment)
    settings = experiment.continuous_eval or config.call_configured(ContinuousEval)
    del experiment

    def finetune(pretrained) -> Dict[str, Any]:
        gin.clear_config()  # The run's config again, with this fine-tune's bindings after it.
        config.parse(gin_files, [*gin_bindings, *finetuning.bindings(pretrained)], search_paths)
        return train_lib.run_experiment(plan, pretrained.directory, strategy, hooks=hooks)

    continuous_finetune.finetune_continuously(directory, finetuning, finetune, settings)
