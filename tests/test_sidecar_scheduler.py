"""The sidecar's scheduling, without TensorFlow: policies, progress, ending, timeout."""

import pytest

from ctl.cluster.tf_config import has_evaluator
from ctl.utils.errors import UserError
from ctl.sidecar.scheduler import (DELETED, EVALUATE, EVALUATED, FAILED, FINISHED, MAX_EVALUATIONS,
                         SKIPPED, TIMEOUT, WAIT, ContinuousEval, Progress, Scheduler)


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def drive(scheduler, ready, final=None, outcome=EVALUATED):
    """Runs decisions until one is not EVALUATE; returns (evaluated numbers, last decision)."""
    done = []
    while True:
        decision = scheduler.decide(ready, final)
        if decision.kind != EVALUATE:
            return done, decision
        for number in decision.skipped:
            scheduler.progress.record(number, SKIPPED)
        scheduler.progress.record(decision.number, outcome)
        done.append(decision.number)


def test_all_policy_evaluates_every_checkpoint_once_in_step_order():
    scheduler = Scheduler(ContinuousEval(), Progress(), clock=FakeClock())
    done, decision = drive(scheduler, {30, 10, 20})
    assert done == [10, 20, 30] and decision.kind == WAIT
    done, decision = drive(scheduler, {20, 30, 40, 50}, final=50)
    assert done == [40, 50] and decision.kind == FINISHED


def test_latest_policy_skips_to_the_newest_and_never_goes_back():
    scheduler = Scheduler(ContinuousEval(policy="latest"), Progress(), clock=FakeClock())
    decision = scheduler.decide({10, 20, 30})
    assert (decision.kind, decision.number, tuple(decision.skipped)) == (EVALUATE, 30, (10, 20))
    scheduler.progress.record(30, EVALUATED)
    assert scheduler.decide({10, 20, 30}).kind == WAIT
    assert drive(scheduler, {30, 40}, final=40)[0] == [40]


def test_progress_survives_a_restart():
    progress = Progress()
    drive(Scheduler(ContinuousEval(), progress, clock=FakeClock()), {10, 20})
    progress.record(30, FAILED)
    progress.record(40, DELETED)
    restored = Progress.from_json(progress.to_json())
    assert restored.outcomes == {10: EVALUATED, 20: EVALUATED, 30: FAILED, 40: DELETED}
    assert restored.evaluations == 2
    done, _ = drive(Scheduler(ContinuousEval(), restored, clock=FakeClock()), {10, 20, 30, 40, 50})
    assert done == [50]


def test_idle_timeout_counts_from_the_last_new_checkpoint():
    clock = FakeClock()
    scheduler = Scheduler(ContinuousEval(timeout=10), Progress(), clock=clock)
    clock.now = 9
    assert drive(scheduler, {10})[1].kind == WAIT  # A new checkpoint resets the idle time.
    clock.now = 18
    assert scheduler.decide({10}).kind == WAIT
    clock.now = 19
    assert scheduler.decide({10}).kind == TIMEOUT


def test_no_timeout_waits_forever():
    clock = FakeClock()
    scheduler = Scheduler(ContinuousEval(timeout=None), Progress(), clock=clock)
    clock.now = 1e9
    assert scheduler.decide(set()).kind == WAIT


def test_max_evaluations_counts_evaluations_not_checkpoint_numbers():
    progress = Progress({1000: EVALUATED, 2000: FAILED})
    scheduler = Scheduler(ContinuousEval(max_evaluations=3), progress, clock=FakeClock())
    done, decision = drive(scheduler, {1000, 2000, 3000, 4000, 5000})
    assert done == [3000, 4000] and decision.kind == MAX_EVALUATIONS


def test_finished_once_the_final_checkpoint_is_handled_even_if_it_failed():
    scheduler = Scheduler(ContinuousEval(), Progress(), clock=FakeClock())
    done, decision = drive(scheduler, {10, 20}, final=20, outcome=FAILED)
    assert done == [10, 20] and decision.kind == FINISHED


def test_final_checkpoint_that_vanished_ends_after_settling():
    clock = FakeClock()
    scheduler = Scheduler(ContinuousEval(settle_seconds=1), Progress(), clock=clock)
    done, decision = drive(scheduler, {10}, final=20)
    assert done == [10] and decision.kind == WAIT  # Final 20 not seen yet: it may still come.
    assert scheduler.decide({10}, final=20).kind == WAIT
    clock.now = 1
    assert scheduler.decide({10}, final=20).kind == FINISHED


@pytest.mark.parametrize("binding, message", [
    ({"policy": "newest"}, "policy='newest'. Expected one of: all, latest"),
    ({"timeout": 0}, "timeout (0) must be positive or None"),
    ({"max_evaluations": -1}, "max_evaluations (-1) must be positive or None"),
    ({"poll_interval": -0.1}, "poll_interval (-0.1) must be a non-negative"),
    # Removed: Keras callbacks have one route, the same in-line and on the sidecar.
    ({"callbacks": [object()]}, "ctl.ContinuousEval.callbacks is gone: list "
     "@ctl.hooks.KerasCallbacks() in ctl.Experiment.hooks"),
])
def test_bad_settings_name_the_parameter(binding, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ContinuousEval(**binding)


def test_all_policy_waits_for_a_lower_checkpoint_to_commit():
    scheduler = Scheduler(ContinuousEval(), Progress(), clock=FakeClock())
    assert scheduler.decide({30}, present={10, 20, 30}).kind == WAIT
    assert scheduler.decide({10, 30}, present={10, 20, 30}).number == 10
    scheduler.progress.record(10, EVALUATED)
    assert scheduler.decide({10, 30}, present={10, 20, 30}).kind == WAIT
    assert scheduler.decide({10, 20, 30}, present={10, 20, 30}).number == 20


def test_final_checkpoint_still_settling_is_waited_for():
    clock = FakeClock()
    scheduler = Scheduler(ContinuousEval(settle_seconds=1), Progress(), clock=clock)
    clock.now = 5
    assert scheduler.decide(set(), final=10, present={10}).kind == WAIT


@pytest.mark.parametrize("tf_config, expected", [
    (None, False),
    ('{"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", "index": 0}}', False),
    ('{"cluster": {"chief": ["127.0.0.1:1"], "evaluator": ["127.0.0.1:2"]}}', True),
])
def test_has_evaluator_reads_the_cluster_of_tf_config(tf_config, expected):
    assert has_evaluator({} if tf_config is None else {"TF_CONFIG": tf_config}) is expected


def test_malformed_tf_config_is_a_user_error():
    with pytest.raises(UserError, match="TF_CONFIG is not valid JSON"):
        has_evaluator({"TF_CONFIG": "{cluster"})
