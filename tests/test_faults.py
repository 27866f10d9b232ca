"""Fault tolerance in-process: NaN policies, the lock, the signal watcher and the guarded loop."""

import os
import signal
import threading
import time

import gin
import numpy as np
import pytest
import tensorflow as tf

import ctl
from ctl.config import gin_config as config
from ctl.model_dir import ModelDir
from ctl.faults.handler import FaultTolerance
from ctl.model_dir.trainer_lock import ModelDirLock
from ctl.faults.nan_guard import NonFiniteLoss, RecoveryBudget
from ctl.core.stop import SignalWatcher
from ctl.faults.preemption import Preempted
from ctl.core.loops import StepGuard
from tests.support.env import ROOT
from tests.support.reading import checkpoint_values, scalars

FAULTS_GIN = os.path.join(ROOT, "tests", "faults.gin")
# In-process: no global seed, so that op determinism is not switched on for the
# rest of the test session (ProbeTask seeds its dropout and shuffle itself).
BASE = ["ctl.FaultTolerance.seed = None", "ctl.Schedule.train_steps = 30"]


def train(model_dir, *bindings, strategy=None):
    config.parse([FAULTS_GIN], [*BASE, *bindings])
    return ctl.run_experiment("train", str(model_dir), strategy)


def one_bad_replica(strategy):
    """Under Mirrored, only the second replica's loss is poisoned: the check sees the sum."""
    return ["ProbeTask.nan_replica = 1"] if strategy.num_replicas_in_sync > 1 else []


def weights(model_dir):
    """Every variable of the latest checkpoint but the input position (no array form)."""
    values = checkpoint_values(tf.train.latest_checkpoint(str(model_dir)))
    return {name: value for name, value in values.items() if value is not None}


@pytest.mark.parametrize("while_loop", [True, False])
def test_nan_stop_names_the_step_not_the_loop(tmp_path, while_loop, strategy):
    with pytest.raises(NonFiniteLoss, match=r"NaN or Inf at step 13 .*nan_policy='stop'"):
        train(tmp_path, "ProbeTask.nan_at_steps = (13,)", *one_bad_replica(strategy),
              f"ctl.Trainer.use_tf_while_loop = {while_loop}", strategy=strategy)
    # The loop of steps 11-20 stopped at 13; nothing after the last good checkpoint was saved.
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-10")
    assert all(np.isfinite(v).all() for v in weights(tmp_path).values())


def test_nan_recover_replays_the_same_data(tmp_path, strategy):
    train(tmp_path / "clean", strategy=strategy)
    gin.clear_config()
    train(tmp_path / "glitch", "ProbeTask.nan_at_steps = (13, 27)", *one_bad_replica(strategy),
          "ctl.FaultTolerance.nan_policy = 'recover'", "ctl.FaultTolerance.max_recoveries = 1",
          "ctl.FaultTolerance.healthy_interval = 5", strategy=strategy)
    # Two glitches 14 steps apart, one recovery allowed "in a row": the healthy
    # interval reset the count. Replaying steps 11-13 and 21-27 reproduced the clean run.
    clean, recovered = weights(tmp_path / "clean"), weights(tmp_path / "glitch")
    assert sorted(clean) == sorted(recovered)
    for name in clean:
        assert clean[name].tobytes() == recovered[name].tobytes(), name


@pytest.mark.parametrize("while_loop", [True, False])
def test_nan_recover_in_the_last_loop_replays_to_train_steps(tmp_path, while_loop):
    """A NaN at the last step, or earlier in the last loop: the run restores ckpt-20,
    replays to step 30, and its summaries carry on from the restored step."""
    train(tmp_path / "clean", f"ctl.Trainer.use_tf_while_loop = {while_loop}")
    clean = weights(tmp_path / "clean")
    for bad in (30, 25):
        gin.clear_config()
        model_dir = tmp_path / f"nan_at_{bad}"
        train(model_dir, f"ProbeTask.nan_at_steps = ({bad},)",
              "ctl.FaultTolerance.nan_policy = 'recover'",
              f"ctl.Trainer.use_tf_while_loop = {while_loop}")
        assert tf.train.latest_checkpoint(str(model_dir)).endswith("ckpt-30"), bad
        with open(model_dir / "ctl_run_finished.json") as f:
            assert '"final_step": 30' in f.read(), bad
        recovered = weights(model_dir)
        for name in clean:
            assert clean[name].tobytes() == recovered[name].tobytes(), (bad, name)
        # The loop that hit the NaN is summarized at the restored step (20), the replay at 30.
        loss = scalars(str(model_dir / "train"))["loss"]
        assert sorted(loss) == [10, 20, 30], (bad, loss)
        assert np.isfinite(loss[30]), (bad, loss)


def test_nan_recover_gives_up_after_max_recoveries(tmp_path):
    with pytest.raises(NonFiniteLoss, match=r"step 13 \(2 recoveries already tried"):
        train(tmp_path, "ProbeTask.nan_at_steps = (13,)", "ProbeTask.transient = False",
              "ctl.FaultTolerance.nan_policy = 'recover'", "ctl.FaultTolerance.max_recoveries = 2")


def test_recovery_budget_resets_after_a_healthy_interval():
    budget = RecoveryBudget(max_recoveries=2, healthy_interval=100)
    assert budget.spend(50) and budget.spend(50)
    budget.resumed_at(40)
    assert not budget.spend(60)  # Third in a row.
    budget.resumed_at(40)
    assert budget.spend(141) and budget.used == 1  # 100 healthy steps since 40.


@pytest.mark.parametrize("field, value, message", [
    ("nan_policy", "retry", "Expected one of: stop, recover"),
    ("max_recoveries", -1, "max_recoveries (-1) must be a non-negative integer"),
    ("seed", 1.5, "seed (1.5) must be an integer"),
    ("stop_check", "epoch", "Expected one of: step, loop"),
])
def test_bad_fault_tolerance_settings(field, value, message):
    with pytest.raises(ctl.UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        FaultTolerance(**{field: value})


def test_lock_refuses_a_second_holder_and_is_released(tmp_path):
    with ModelDirLock(ModelDir(str(tmp_path))):
        with pytest.raises(ctl.UserError, match=rf"in use by another trainer \(pid {os.getpid()} on host"):
            ModelDirLock(ModelDir(str(tmp_path))).acquire()
    with ModelDirLock(ModelDir(str(tmp_path))):  # Released on exit.
        pass


def test_signal_stops_a_tf_while_loop_within_a_step():
    steps = tf.Variable(0, dtype=tf.int64)
    before = signal.getsignal(signal.SIGTERM)
    with SignalWatcher() as watcher:
        guard = StepGuard(watcher, steps)

        def step(_):
            steps.assign_add(1)
            return guard.check_loss(tf.distribute.get_strategy(), tf.constant(1.0), steps)

        loop = tf.function(guard.graph_loop(step))
        loop(None, tf.constant(1))  # Traced before the clock starts.
        timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM))
        timer.start()
        try:
            loop(None, tf.constant(2**31 - 1))  # Hours, unless the signal stops it.
        finally:
            timer.cancel()
        assert watcher.signum == signal.SIGTERM
    assert 1 < int(steps.numpy()) < 2**31 - 1
    assert signal.getsignal(signal.SIGTERM) == before  # Handlers restored.


def test_a_pipeline_with_unsaveable_state_is_named_at_start():
    from ctl.faults import resume
    from tests.fault_tasks import ProbeTask

    class Noisy(ProbeTask):
        def build_inputs(self, training, input_context=None):
            dataset = super().build_inputs(training, input_context)
            return dataset.map(lambda x, y: (x + tf.random.uniform(tf.shape(x)), y))

    assert resume.stateful_input_op(ProbeTask()) is None  # Seeded shuffle: saveable.
    assert "RandomUniform is stateful" in resume.stateful_input_op(Noisy())


@pytest.mark.parametrize("seed", [None, 3], ids=["unseeded", "seeded"])
def test_a_run_of_a_pipeline_with_unsaveable_state_says_so_before_its_first_step(tmp_path, seed):
    # The pipeline is probed on a thread of its own beside the restore and the train step's
    # trace; what it found is said before the first loop's line.
    import logging

    from tests.fault_tasks import ProbeTask

    class Noisy(ProbeTask):
        def build_inputs(self, training, input_context=None):
            dataset = super().build_inputs(training, input_context)
            return dataset.map(lambda x, y: (x + tf.random.uniform(tf.shape(x)), y))

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("ctl")
    logger.addHandler(handler)
    try:
        ctl.run_experiment("train", str(tmp_path), experiment=ctl.Experiment(
            task=Noisy(), fault_tolerance=FaultTolerance(seed=seed), schedule=ctl.Schedule(
                train_steps=2, steps_per_loop=2, checkpoint_interval=2, eval_interval=None)))
    finally:
        logger.removeHandler(handler)
    said = [(record.levelname, record.getMessage()) for record in records
            if "RandomUniform is stateful" in record.getMessage()]
    expected = (("INFO", "a resume reads the batches already consumed again") if seed else
                ("WARNING", "set ctl.FaultTolerance.seed"))
    assert len(said) == 1 and said[0][0] == expected[0] and expected[1] in said[0][1], said
    first_loop = next(k for k, record in enumerate(records)
                      if hasattr(record, "ctl_progress"))
    assert records.index(next(r for r in records if "RandomUniform is stateful" in r.getMessage())) < first_loop


class _SignalAfterStep(ctl.hooks.Hook):
    """Sends this process SIGTERM from the train actions of the loop that ends at `step`, and
    waits (up to 60 s) until `received()`: the watcher thread has set the stop. Without the
    wait the next loop's ten tiny steps could all run before that thread got a core."""

    def __init__(self, step, received):
        self.step, self.received = step, received

    def on_train_loop_end(self, unused_logs):
        if self.run.step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)
            deadline = time.monotonic() + 60
            while not self.received() and time.monotonic() < deadline:
                time.sleep(0.01)


@pytest.mark.parametrize("stop_check, stopped_at", [("step", (20, 21)), ("loop", (30,))])
def test_stop_check_loop_lets_a_signal_wait_for_the_loop_end(tmp_path, caplog, stop_check, stopped_at):
    config.parse([FAULTS_GIN], [*BASE, "ctl.Schedule.train_steps = 60",
                                f"ctl.FaultTolerance.stop_check = '{stop_check}'"])
    said = "received SIGTERM: saving a checkpoint at the next step boundary"  # Once the loops can read it.
    experiment = ctl.Experiment(hooks=[_SignalAfterStep(20, lambda: said in caplog.text)])
    with pytest.raises(Preempted) as stopped:
        ctl.run_experiment("train", str(tmp_path), experiment=experiment)
    # 'step': the guard ends the next loop before its first step (or its second, if the
    # watcher thread set the flag after that step began); 'loop': that loop runs to its end.
    assert stopped.value.step in stopped_at
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith(f"ckpt-{stopped.value.step}")


def test_stop_check_loop_names_the_loop_of_a_nan(tmp_path):
    with pytest.raises(NonFiniteLoss, match=r"NaN or Inf in the loop ending at step 20 "):
        train(tmp_path, "ProbeTask.nan_at_steps = (13,)", "ctl.FaultTolerance.stop_check = 'loop'")
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-10")
    assert all(np.isfinite(v).all() for v in weights(tmp_path).values())


def test_stop_check_loop_recovers_the_same_weights(tmp_path):
    train(tmp_path / "clean", "ctl.FaultTolerance.stop_check = 'loop'")
    gin.clear_config()
    train(tmp_path / "glitch", "ProbeTask.nan_at_steps = (13,)",
          "ctl.FaultTolerance.nan_policy = 'recover'", "ctl.FaultTolerance.stop_check = 'loop'")
    clean, recovered = weights(tmp_path / "clean"), weights(tmp_path / "glitch")
    assert sorted(clean) == sorted(recovered)
    for name in clean:
        assert clean[name].tobytes() == recovered[name].tobytes(), name


def test_a_seeded_run_seeds_before_its_task_is_built(tmp_path):
    # The seed comes before gin builds the experiment, so a task draws the same numbers in
    # every run and keeps what it made (a seed set after it would drop Model Garden's WMT
    # tokenizer: tf.random.set_seed clears TensorFlow's kernel cache).
    from tests.fault_tasks import DrawsWhenBuilt

    DrawsWhenBuilt.drawn.clear()
    try:
        for name in ("a", "b"):
            gin.parse_config(["import tests.fault_tasks", "ctl.Experiment.task = @DrawsWhenBuilt()",
                              "ctl.Schedule.train_steps = 2", "ctl.Schedule.steps_per_loop = 2",
                              "ctl.FaultTolerance.seed = 3"])
            ctl.run_experiment("train", str(tmp_path / name))
            gin.clear_config()
            tf.random.uniform([])  # The process's stream moves on between runs.
    finally:
        gin.clear_config()
    assert len(DrawsWhenBuilt.drawn) == 2 and DrawsWhenBuilt.drawn[0] == DrawsWhenBuilt.drawn[1]
