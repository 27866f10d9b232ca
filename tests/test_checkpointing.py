"""Checkpoint intervals (pure logic) and validated restores."""

import pytest
import tensorflow as tf

import ctl
from ctl.core import checkpoint_contents
from ctl.core.checkpointing import CheckpointManager, interval_crossed
from ctl.model_dir import ModelDir


@pytest.mark.parametrize("last, step, expected", [
    (None, 100, False), (None, 500, True), (0, 499, False), (0, 500, True),
    (500, 900, False), (500, 1000, True), (400, 1100, True),  # Loops that jump a multiple.
    (1000, 1000, False),
])
def test_interval_crossed_fires_on_multiples_of_the_interval(last, step, expected):
    assert interval_crossed(500, last, step) is expected


def test_manager_saves_on_multiples_and_resumes_the_count(tmp_path):
    step = tf.Variable(0, dtype=tf.int64)
    checkpoint = tf.train.Checkpoint(step=step)

    def manager():
        return CheckpointManager(checkpoint, ModelDir(str(tmp_path)), max_to_keep=10, step_counter=step,
                                 checkpoint_interval=500)

    first = manager()
    saved = []
    for value in range(100, 1300, 300):  # Steps 100, 400, 700, 1000
        step.assign(value)
        saved.append(first.save() is not None)
    assert saved == [False, False, True, True]
    step.assign(1200)
    assert manager().save() is None  # A new manager knows 1000 was the last save.
    step.assign(1500)
    assert manager().save().endswith("ckpt-1500")


def test_restore_refuses_a_checkpoint_of_another_model(tmp_path):
    tf.train.Checkpoint(w=tf.Variable(tf.zeros((3, 1)))).save(str(tmp_path / "ckpt"))
    other = tf.train.Checkpoint(w=tf.Variable(tf.zeros((4, 1))))
    with pytest.raises(ctl.UserError, match="checkpoint of a different model"):
        CheckpointManager(other, ModelDir(str(tmp_path)), max_to_keep=1,
                          step_counter=tf.Variable(0)).restore_or_initialize()


def test_a_run_resumed_between_loop_ends_finishes_its_loop_first(tmp_path):
    # A signal's checkpoint falls mid-loop (step 3 of loops of 2): the resumed run's first loop
    # ends at 4, so its loops, summaries and checkpoints, and any state a loop resets (a model's
    # own metrics, Model Garden's ranking models'), fall where an uninterrupted run's do.
    from ctl.core.controller import Checkpoints, Controller

    class Steps:  # An orbit trainer: moves the global step, says how far each loop went.
        def __init__(self, global_step):
            self.global_step, self.loops = global_step, []

        def train(self, num_steps):
            self.loops.append(int(num_steps))
            self.global_step.assign_add(int(num_steps))

    global_step = tf.Variable(3, dtype=tf.int64)
    trainer = Steps(global_step)
    manager = CheckpointManager(tf.train.Checkpoint(step=global_step), ModelDir(str(tmp_path)),
                                max_to_keep=10, step_counter=global_step, checkpoint_interval=2)
    controller = Controller(global_step=global_step, trainer=trainer, steps_per_loop=2,
                            checkpoints=Checkpoints(manager=manager))
    controller.train(8)
    assert trainer.loops == [1, 2, 2]
    assert [int(p.rsplit("-", 1)[1]) for p in manager.checkpoints] == [4, 6, 8]


def test_a_checkpoint_without_the_tasks_items_nor_rng_restores_and_says_so(tmp_path, caplog):
    # A task's `checkpoint_items` (Model Garden's `backbone`) are parts of the model held at the
    # checkpoint's top level too: one written without them and without `rng` (an older ctl's)
    # restores, each variable found under `model`, with the line on the random states.
    import logging

    from ctl.core import checkpointing
    from tests.fault_tasks import LateDropoutTask

    class WithBody(LateDropoutTask):
        def checkpoint_items(self, model):
            return {"body": model.body}

    written = ctl.Trainer(WithBody(), evaluate=False)
    written.train(tf.constant(1))
    assert "body" in checkpoint_contents.SavedGraph(tf.train.load_checkpoint(
        written.checkpoint.write(str(tmp_path / "new" / "ckpt")))).root_children()
    path = tf.train.Checkpoint(  # As an older ctl wrote it: no items, no random state.
        global_step=written.global_step, model=written.model,
        optimizer=written.optimizer).save(str(tmp_path / "ckpt"))
    trainer = ctl.Trainer(WithBody(), evaluate=False)
    trainer.trace_train_loop()
    assert len(trainer.checkpoint.rng) == 1
    with caplog.at_level(logging.INFO, logger="ctl"):
        checkpointing.restore(trainer.checkpoint, path, ModelDir(str(tmp_path)))
    assert trainer.model.body.kernel.numpy().tolist() == written.model.body.kernel.numpy().tolist()
    assert "holds no random state" in caplog.text


def test_a_checkpoint_without_the_state_of_a_late_generator_restores_and_says_so(tmp_path, caplog):
    # A ctl before the states of layers built on the model's first call were saved wrote the
    # early dropout's state only; restored after the step's trace (a NaN's recovery), where the
    # late one is in the checkpoint too, every other variable matches: the late one keeps its
    # state, and a line says so (not "a checkpoint of a different model").
    import logging

    from ctl.core import checkpointing
    from tests.fault_tasks import LateDropoutTask

    class EarlyAndLate(LateDropoutTask):
        def build_model(self):
            model = super().build_model()
            model.early = self.k.layers.Dropout(0.5, seed=5, rng_type="stateful")
            model.early.build((None, 3))  # Makes its generator now.
            return model

    written = ctl.Trainer(EarlyAndLate(), evaluate=False)
    assert len(written.checkpoint.rng) == 1
    written.train(tf.constant(1))
    path = tf.train.Checkpoint(  # As that ctl wrote it: the states it found when it was built.
        global_step=written.global_step, model=written.model, optimizer=written.optimizer,
        rng=list(written.checkpoint.rng)[:1]).save(str(tmp_path / "ckpt"))
    trainer = ctl.Trainer(EarlyAndLate(), evaluate=False)
    trainer.trace_train_loop()
    assert len(trainer.checkpoint.rng) == 2
    trainer.checkpoint.rng[0].assign_add(tf.ones_like(trainer.checkpoint.rng[0]))
    with caplog.at_level(logging.INFO, logger="ctl"):
        checkpointing.restore(trainer.checkpoint, path, ModelDir(str(tmp_path)))
    assert trainer.checkpoint.rng[0].numpy().tolist() == written.checkpoint.rng[0].numpy().tolist()
    assert "holds 1 of the model's 2 random states" in caplog.text
