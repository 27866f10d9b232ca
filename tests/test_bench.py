"""The benchmark suite's plumbing: what it runs and reports, not how fast."""

import collections
import subprocess
import sys
import time

import numpy as np
import pytest

from bench import loops, measure, object_store, run
from bench.workloads import BenchTask
from tests.support.env import ROOT


@pytest.fixture(autouse=True, scope="module")
def _restore_signal_handlers():
    yield
    loops.release_watcher()  # The benchmarks install ctl's SIGTERM watcher for the process.


@pytest.mark.parametrize("count", [2, 3, 4, 7])
def test_interleave_has_each_variant_follow_every_other_equally_often(count):
    names = "abcdefg"[:count]
    calls = []
    orders = measure.balanced_orders(count)
    times = measure.interleave({n: (lambda n=n: calls.append(n)) for n in names},
                               rounds=len(orders), settle_s=0)
    rounds = [calls[i:i + count] for i in range(0, len(calls), count)]
    assert all(sorted(order) == list(names) for order in rounds)
    pairs = collections.Counter((a, b) for order in rounds for a, b in zip(order, order[1:]))
    assert set(pairs) == {(a, b) for a in names for b in names if a != b}
    assert len(set(pairs.values())) == 1, pairs
    assert {n: len(t) for n, t in times.items()} == {n: len(orders) for n in names}


def test_interleave_pauses_after_each_call_outside_its_time():
    started = []
    times = measure.interleave({n: (lambda: started.append(time.perf_counter())) for n in "ab"},
                               rounds=2, settle_s=0.3)  # Each call takes microseconds.
    assert all(t < 0.3 for values in times.values() for t in values), times
    assert min(b - a for a, b in zip(started, started[1:])) >= 0.3


def test_variants_are_built_forward_then_backward():
    order = []
    built = measure.build_balanced({n: (lambda n=n: order.append(n) or f"{n}{len(order)}")
                                    for n in "abc"}, instances=3)
    assert order == list("abc" "cba" "abc")
    assert built == {"a": ["a1", "a6", "a7"], "b": ["b2", "b5", "b8"], "c": ["c3", "c4", "c9"]}


def test_a_seed_draws_each_variant_s_places_and_keeps_the_orders_balanced():
    names = "abcdef"

    def run(seed):
        built, calls = [], []
        measure.build_balanced({n: (lambda n=n: built.append(n)) for n in names}, 2, seed)
        measure.interleave({n: (lambda n=n: calls.append(n)) for n in names}, rounds=6,
                           settle_s=0, seed=seed)
        return built, calls

    draws = [run(seed) for seed in range(8)]
    assert run(3) == draws[3]  # The reported seed reproduces the run's orders.
    firsts = {built[0] for built, _ in draws}
    assert len(firsts) > 2, firsts  # Not the given order, nor one fixed other.
    assert {calls[0] for _, calls in draws} != {"a"}
    for built, calls in draws:
        assert built[:6] == built[6:][::-1] and sorted(built[:6]) == list(names)
        rounds = [calls[i:i + 6] for i in range(0, 36, 6)]
        pairs = collections.Counter((a, b) for order in rounds for a, b in zip(order, order[1:]))
        assert len(pairs) == 30 and set(pairs.values()) == {1}


def test_ratios_and_differences_are_of_medians():
    assert measure.ratio([1.0, 2.0, 90.0], [1.0, 1.0, 50.0]) == 2.0
    assert measure.difference([3.0, 5.0, 4.0], [1.0, 1.0, 9.0]) == 3.0


def test_every_loop_trains_the_steps_it_is_asked_for():
    task = BenchTask("mlp")
    trainer, controller = loops.ctl_controller(task, steps_per_loop=10)
    before = [v.numpy().copy() for v in trainer.model.trainable_variables]
    controller.train(20, checkpoint_at_completion=False)
    assert int(trainer.optimizer.iterations.numpy()) == 20
    assert any(not np.array_equal(a, b.numpy())
               for a, b in zip(before, trainer.model.trainable_variables))
    # The figures' driver, over ctl's and orbit's controllers: a warm-up loop, then 20 steps.
    for train in (loops.ctl_train(task, steps_per_loop=10), loops.orbit_train(task, steps_per_loop=10)):
        train(20)
        assert int(train.global_step.numpy()) == 30
    for fused in (False, True):
        raw = loops.raw_train(task, steps_per_loop=10, fused=fused)  # Warm-up: one loop.
        raw(20)
        assert int(raw.optimizer.iterations.numpy()) == 30, fused
        evaluate = loops.raw_eval(task, fused=fused)
        results = evaluate(3)
        assert set(results) == {"loss", "accuracy"}
        assert np.isfinite(results["loss"]) and 0 <= results["accuracy"] <= 1


def test_runner_skips_a_missing_figure_script_with_a_note(monkeypatch, tmp_path):
    monkeypatch.setitem(run.FIGURES, "sidecar_latency", (["bench/no_such_script.py"], [], []))
    monkeypatch.setattr(run, "RESULTS", str(tmp_path))
    [record] = run.run_figure("sidecar_latency", quick=True)
    assert record["figure"] == "sidecar_latency"
    assert "not in this checkout" in record["skipped"]


@pytest.mark.slow  # Starts a Python process (tests/support/tiers.py).
def test_runner_rejects_an_unknown_figure():
    result = subprocess.run([sys.executable, "-m", "bench.run", "--only", "speed"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60,
                            env={"PYTHONPATH": ROOT, "PATH": "/usr/bin:/bin"})
    assert result.returncode == 2
    assert "unknown figure(s) ['speed']" in result.stderr
    assert result.stdout == ""


@pytest.mark.slow  # Starts a Python process (tests/support/tiers.py).
def test_runner_names_and_judges_an_external_figure(monkeypatch, tmp_path):
    script = tmp_path / "latency.py"
    script.write_text('import json\nprint("log line")\nprint(json.dumps({"median_s": 0.5}))\n')
    monkeypatch.setitem(run.FIGURES, "sidecar_latency", ([str(script)], [], []))
    monkeypatch.setattr(run, "RESULTS", str(tmp_path))
    [record] = run.run_figure("sidecar_latency", quick=False)
    assert record["figure"] == "sidecar_latency"
    assert record["median_s"] == 0.5
    assert record["target"] == "median_s <= 0.2" and record["met"] is False


@pytest.mark.slow  # Starts a Python process (tests/support/tiers.py).
def test_runner_runs_a_figure_in_another_checkout_and_names_it(monkeypatch, tmp_path):
    other = tmp_path / "old"
    (other / "bench").mkdir(parents=True)
    (other / "bench" / "latency.py").write_text(
        'import json, os\nprint(json.dumps({"median_s": 0.1, "cwd": os.getcwd(), '
        '"path": os.environ["PYTHONPATH"]}))\n')
    monkeypatch.setitem(run.FIGURES, "sidecar_latency", (["bench/latency.py"], [], []))
    monkeypatch.setattr(run, "RESULTS", str(tmp_path))
    [record] = run.run_figure("sidecar_latency", quick=False, root=str(other), checkout="against")
    assert record["cwd"] == record["path"] == str(other)  # Its code, not this checkout's.
    assert record["checkout"] == "against" and record["load_average"] >= 0


def test_repeated_runs_are_combined_into_medians_with_spread():
    runs = [[{"figure": "f", "variant": "ctl", "ratio": r, "met": r >= 1.0, "order_seed": seed},
             {"figure": "f", "variant": "raw", "ratio": 1.0}]
            for r, seed in ((0.9, 7), (1.2, 3), (1.0, 5))]
    ctl_line, raw_line = run.combine(runs)
    assert ctl_line["variant"] == "ctl" and ctl_line["ratio"] == 1.0
    assert ctl_line["order_seed"] == [7, 3, 5]  # Each run's, not a median of them.
    assert ctl_line["spread"] == {"ratio": [0.9, 1.2]}
    assert ctl_line["met_runs"] == "2/3" and ctl_line["met"] is True
    assert raw_line["repeats"] == 3 and raw_line["spread"] == {"ratio": [1.0, 1.0]}


def test_persistent_keras_fit_trains_an_epoch_per_call():
    task = BenchTask("mlp")
    fit = loops.keras_fit(task, steps_per_loop=10, steps_per_call=20)  # Warm-up: one epoch.
    fit(20)
    fit(20)
    with pytest.raises(ValueError, match="epochs of 20 steps"):
        fit(10)
    model = fit.__self__.model
    assert int(model.optimizer.iterations.numpy()) == 60


def test_train_step_settings_reach_ctl_and_keras_fit():
    """The variants of the train_step_speed figure differ in the setting they measure, and train."""
    trainer, controller = loops.ctl_controller(
        BenchTask("mlp"), steps_per_loop=5, trainer_options={"mixed_precision": "mixed_bfloat16"})
    assert trainer.model.layers[-1].compute_dtype == "bfloat16"
    controller.train(5, checkpoint_at_completion=False)
    assert int(trainer.optimizer.iterations.numpy()) == 5
    fit = loops.keras_fit(BenchTask("mlp"), steps_per_loop=5, steps_per_call=5,
                          mixed_precision="mixed_bfloat16")
    assert fit.__self__.model.layers[-1].compute_dtype == "bfloat16"


def test_the_eval_twin_evaluates_ctl_s_model_on_ctl_s_data():
    """Figure 2's target compares ctl's evaluation with this twin: their results are the same."""
    ctl_evaluate, twin, in_place, model = loops.ctl_eval_and_twin(BenchTask("mlp"))
    for variable in model.trainable_variables:  # Unlike a model built afresh from the task.
        variable.assign(variable * 3.0)
    ours = ctl_evaluate(3)
    for theirs in (twin(3), in_place(3)):
        assert ours["accuracy"] == pytest.approx(theirs["accuracy"])
        assert ours["loss"] == pytest.approx(theirs["loss"], rel=1e-5)


@pytest.mark.parametrize("argument, message", [
    ("--latencies=0,x", "--latencies: expected distinct non-negative milliseconds"),
    ("--latencies=50,50", "received '50,50'"),
    ("--systems=ctl,keras", "--systems: expected some of ['ctl', 'mg'], received 'ctl,keras'"),
    ("--sidecar_intervals=", "--sidecar_intervals: expected non-negative seconds"),
    ("--rounds=0", "--rounds (0) and --train_steps (10000) must be positive"),
])
@pytest.mark.slow  # Starts a Python process (tests/support/tiers.py).
def test_object_store_figure_rejects_bad_arguments_before_starting_anything(argument, message):
    result = subprocess.run([sys.executable, "-m", "bench.object_store", argument], cwd=ROOT,
                            capture_output=True, text=True, timeout=60,
                            env={"PYTHONPATH": ROOT, "PATH": "/usr/bin:/bin"})
    assert result.returncode == 2
    assert message in result.stderr
    assert result.stdout == ""


def test_object_store_ratios_are_of_medians_per_system_and_storage():
    seconds = {"ctl": {"local": [10, 12, 30], "gs@0": [11, 13], "gs@50": [20, 16, 18]},
               "mg": {"local": [8, 8], "gs@0": [9, 9], "gs@50": [36, 36]}}
    lines = object_store.ratios(seconds, [0, 50])
    assert lines["ctl"]["seconds"] == {"local": 12, "gs@0": 12, "gs@50": 18}
    assert lines["ctl"]["gs@50_over_local"] == 1.5 and lines["ctl"]["gs@0_over_local"] == 1.0
    assert lines["mg"]["gs@50_over_local"] == 4.5
    assert lines["ctl"]["ctl_over_mg_gs@50"] == 0.5 and lines["ctl"]["ctl_over_mg_local"] == 1.5
    assert "ctl_over_mg_local" not in lines["mg"]

