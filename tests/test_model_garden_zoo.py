"""`python -m bench.model_garden_zoo` on a representative few of Model Garden's registered
experiments: each trains on ctl with Model Garden's own numbers (train_lib from the same start,
files and seeds: the same losses, eval metrics and weights, bit for bit). The whole registry's
table is docs/how-to/model-garden-zoo.md, generated from the committed results file."""

import inspect
import json
import os
import shutil
import subprocess
import sys

import pytest

from bench.model_garden_zoo import page
from tests.support.env import ROOT, ctl_env

# The rows that fit the suite's budget: classification, and Model Garden's mock (its aggregation
# reports a 'loss' of its own). The NLP and ranking rows take a minute or more each, detection,
# segmentation and video minutes of tracing: the committed table says where their rows stand.
REPRESENTATIVES = ["image_classification", "mock"]
KEYS = {"experiment", "trains", "same_loss", "max_rel_loss_diff", "same_eval", "ctl_s_per_step",
        "train_lib_s_per_step", "ctl_first_step_s", "train_lib_first_step_s", "reason"}


def zoo(*args, timeout=900):
    return subprocess.run([sys.executable, "-m", "bench.model_garden_zoo", *args], cwd=ROOT,
                          env=ctl_env({"TF_CPP_MIN_LOG_LEVEL": "2"}), capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.slow
def test_representative_experiments_train_with_model_gardens_numbers(tmp_path):
    results = tmp_path / "zoo.json"
    out = zoo(f"--experiments={','.join(REPRESENTATIVES)}", "--steps=3", "--jobs=1",
              f"--results={results}", f"--workdir={tmp_path / 'work'}")
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [line["experiment"] for line in lines] == REPRESENTATIVES
    assert all(set(line) == KEYS for line in lines)
    for row in json.loads(results.read_text())["rows"]:
        assert row["trains"], row["reason"]
        assert row["bit_identical_loss"] and row["max_rel_loss_diff"] == 0.0, row["losses"]
        assert row["same_eval"] and row["eval"], row["eval"]
        assert row["same_weights"], row["experiment"]
        assert len(row["losses"]["ctl"]) == 3
        for trainer in ("ctl", "train_lib"):  # The first step comes within the whole run.
            assert 0 < row[f"{trainer}_first_step_s"] <= row[f"{trainer}_s"], row


@pytest.mark.slow  # Starts a Python process (tests/support/tiers.py).
def test_an_experiment_not_in_the_registry_is_one_line_and_exit_2(tmp_path):
    out = zoo("--experiments=image_classification,no_such/experiment", f"--results={tmp_path / 'r.json'}",
              timeout=300)
    assert out.returncode == 2
    lines = [line for line in out.stderr.splitlines() if line.startswith("--experiments")]
    assert len(lines) == 1 and "'no_such/experiment'" in lines[0], out.stderr[-2000:]
    assert not (tmp_path / "r.json").exists()


def test_the_guarantees_page_names_the_rows_the_committed_results_hold_on():
    """docs/explanation/guarantees.md's "*Model Garden*" items are the committed results' (each
    guarantee's families and rows), written by `python -m bench.model_garden_zoo.page`."""
    from bench.model_garden_zoo import guarantees, guarantees_page

    with open(page.DOCS_RESULTS) as f:
        rows = json.load(f)["rows"]
    with open(page.GUARANTEES_PAGE) as f:
        text = f.read()
    written, missing = guarantees_page.docs_items(text, rows)
    assert not missing and written == text, "run `python -m bench.model_garden_zoo.page`"
    # Each row that holds kill -9 is named in that item, with its family.
    item = guarantees_page.docs_item(rows, "kill_9")
    for row in rows:
        if (row.get("guarantees") or {}).get("kill_9", {}).get("holds"):
            assert f"`{row['experiment']}`" in item and row["family"] in item
    assert set(guarantees.COLUMNS) == set(guarantees_page.WHAT)


def test_the_docs_page_is_the_committed_results_rendered():
    with open(page.DOCS_RESULTS) as f:
        results = json.load(f)
    with open(page.PAGE) as f:
        assert f.read() == page.render(results), "run `python -m bench.model_garden_zoo.page`"
    assert {row["experiment"] for row in results["rows"]} and results["registered"] == len(results["rows"])
    # The run's record (commit, host load) is the maintainers', in bench/README.md, not the page's.
    with open(os.path.join(page.ROOT, "bench", "README.md")) as f:
        assert " ".join(page.record(results).split()) in " ".join(f.read().split())


def test_generated_detection_records_hold_instance_masks_of_0_and_1_as_cocos_do(tmp_path):
    # Model Garden's decoder takes a PNG mask's values as they are (no binarizing by default):
    # a mask of 255s is a target its mask loss cannot take (Cascade R-CNN's went negative and
    # diverged under both trainers).
    import tensorflow as tf
    from official.vision.dataloaders import tf_example_decoder

    from bench.model_garden_zoo import data, registry

    registry.import_all()
    overrides = data.data_overrides("maskrcnn_resnetfpn_coco", str(tmp_path))
    pattern = overrides[0]["task"]["train_data"]["input_path"]
    decoder = tf_example_decoder.TfExampleDecoder(include_mask=True)
    values = set()
    for record in tf.data.TFRecordDataset(tf.io.gfile.glob(pattern)).take(4):
        values |= set(decoder.decode(record)["groundtruth_instance_masks"].numpy().ravel().tolist())
    assert values == {0.0, 1.0}


def test_the_a_a_check_finds_a_dataset_that_yields_other_batches_when_built_again():
    # A row whose numbers differ checks train_lib against itself: among other things, the train
    # dataset built again after the same global seed (Model Garden's text pretraining pipeline
    # masks tokens with a random shuffle that does not repeat itself under op determinism).
    import itertools

    import tensorflow as tf

    from bench.model_garden_zoo import repeat

    def seeded():  # Random ops under the global seed: the same batches at every build.
        return tf.data.Dataset.range(6).map(lambda x: tf.random.uniform([3]) + tf.cast(x, tf.float32))

    assert repeat.first_differing_batch(seeded, batches=4) is None
    builds = itertools.count()

    def drifting():  # Its third batch depends on which build it is: not reproducible.
        build = next(builds)
        return tf.data.Dataset.from_tensor_slices([[0, 0], [1, 1], [2, build], [3, 3]])

    assert repeat.first_differing_batch(drifting, batches=4) == 3
    again = {"max_rel_loss_diff": 7e-3, "eval": {"loss": [4.2, 4.1], "accuracy": [0.5, 0.5]},
             "first_differing_batch": 3}
    said = repeat.reason(again, tolerance=1e-5)
    assert said.startswith("train_lib does not reproduce itself") and "7.00e-03" in said
    assert "loss 4.2 vs 4.1" in said and "accuracy" not in said and "from batch 3" in said
    assert repeat.reason({"max_rel_loss_diff": 0.0, "eval": {"loss": [4.2, 4.2]},
                          "first_differing_batch": None}, tolerance=1e-5) == ""


def test_a_guarantee_that_does_not_hold_says_why_and_an_unchecked_row_says_not_run(tmp_path):
    # The guarantee columns (bench/model_garden_zoo/guarantees.py): the first differing step or
    # weight is the row's line; a row never checked is "not run", never a silent "yes".
    import numpy as np
    import tensorflow as tf

    from bench.model_garden_zoo import guarantees, guarantees_page

    reference = {1: 10, 2: 11, 3: 12}
    assert guarantees.same_steps(reference, [("killed", [(1, 10)]), ("restarted", [(2, 11), (3, 12)])],
                                 [[1], [2, 3]]) == ""
    said = guarantees.same_steps(reference, [("killed", [(1, 10)]), ("restarted", [(2, 11), (3, 99)])],
                                 [[1], [2, 3]])
    assert said.startswith("step 3's loss") and "restarted" in said
    assert "ran steps [2]" in guarantees.same_steps(reference, [("restarted", [(2, 11)])], [[2, 3]])
    paths = []
    for k, value in enumerate([1.0, 1.0, 1.0 + 1e-6]):
        checkpoint = tf.train.Checkpoint(w=tf.Variable(np.full([4], value, np.float32)))
        paths.append(checkpoint.write(str(tmp_path / f"c{k}")))
    assert guarantees.checkpoint_difference(paths[0], paths[1]) == ("", 0.0)
    first, worst = guarantees.checkpoint_difference(paths[0], paths[2])
    assert first.startswith("w/.ATTRIBUTES/VARIABLE_VALUE: 4 of 4 values differ") and 0 < worst < 1e-5
    assert guarantees.checkpoint_difference(paths[0], paths[2], tolerance=1e-3) == ("", worst)
    row = {"guarantees": {
        "kill_9": {"holds": True, "detail": "bit for bit"},
        "sigterm": {"holds": False, "detail": "exit 1 after SIGTERM, not 75: boom"},
        "sidecar": {"holds": None, "detail": "not run: the trainer beside it failed"},
        "new_replicas": {"holds": True, "max_rel_loss_diff": 2e-7, "max_rel_weight_diff": 3e-6}}}
    assert guarantees_page.cells(row) == "yes | **no** | - | yes (loss 2e-07, weights 3e-06)"
    assert guarantees_page.reason(row) == ("SIGTERM: exit 1 after SIGTERM, not 75: boom; "
                                           "sidecar: not run: the trainer beside it failed")
    assert guarantees_page.cells({}) == "not run | not run | not run | not run"


@pytest.mark.slow  # Three `python -m ctl.run` processes of Model Garden's mock.
def test_the_sidecar_column_compares_with_the_in_line_evaluation_of_the_same_checkpoint(tmp_path):
    # The sidecar's results for a final checkpoint are held against the in-line evaluation of that
    # checkpoint: the uninterrupted run's where the killed run's final checkpoint is its, bit for
    # bit; else the killed run's own, evaluated in a copy (a run at another learning rate stands
    # for a killed run whose checkpoints kill -9 changed; its in-line results for the sidecar's).
    from bench.model_garden_zoo import data, guarantees, registry, variants
    from ctl.model_dir import ModelDir

    registry.import_all()
    row = guarantees._Row("mock", "mock", str(tmp_path))  # noqa: SLF001 (the zoo's own)
    reference, other, same = row.path("reference"), row.path("other"), row.path("same")
    faster = (variants.overrides("mock", guarantees.STEPS) + data.data_overrides("mock", str(tmp_path))
              + [{"trainer": {"optimizer_config": {"learning_rate": {"constant": {"learning_rate": 0.5}}}}}])
    for model_dir, flags in ((reference, ()),
                             (other, (f"--gin_bindings=RecordedModelGardenTask.params_override={faster!r}",))):
        with row.trainer("train_and_eval", model_dir, model_dir + ".steps", *flags) as run:
            assert run.finish(timeout=guarantees.WAIT_S).returncode == 0, run.stderr()[-3000:]
    shutil.copytree(reference, same)
    results = {name: [r for r in ModelDir(d).metrics("eval") if r["step"] == guarantees.STEPS][-1]
               for name, d in (("reference", reference), ("other", other))}
    assert results["reference"]["loss"] != results["other"]["loss"]  # Other weights, other results.

    column = guarantees.sidecar_against_in_line(row, results["other"], reference, other)
    assert column["holds"] is True and column["compared_with"] == "killed", column
    assert "in-line evaluation of the same checkpoint (the killed run's" in column["detail"]
    copy = ModelDir(row.path("kill_9-final"))  # Evaluated there; the killed run's dir as it was.
    assert list(copy.checkpoints()) == [guarantees.STEPS] and copy.metrics("eval")
    assert [r["step"] for r in ModelDir(other).metrics("eval")] == [guarantees.STEPS]
    assert not ModelDir(other).sidecar_evaluations()

    column = guarantees.sidecar_against_in_line(row, results["reference"], reference, same)
    assert column["holds"] is True and column["compared_with"] == "uninterrupted", column
    # The killed run's results against a run's with other weights: they do not hold.
    column = guarantees.sidecar_against_in_line(row, results["other"], reference, same)
    assert column["holds"] is False and "differ from the in-line evaluation" in column["detail"]


def test_the_two_replica_check_expects_the_examples_each_run_read():
    """`new_replicas` checks each `train_examples` record against the examples its run's steps
    read (the recorded task's batches). Model Garden's mock gives each replica a batch of 2
    whatever the replicas: steps 4-6 at two replicas read 4 each, so that run counts 18 at step
    6, the uninterrupted run 12, and both are right; a count off what was read is the finding."""
    from bench.model_garden_zoo import guarantees

    assert (guarantees.HOLD_AT, guarantees.STEPS) == (3, 6)
    one = {step: 2 for step in range(1, 7)}  # The uninterrupted run: one replica's batch of 2.
    two = {step: 2 + 2 for step in range(4, 7)}  # Both replicas' batches, after the resume.
    problem, said = guarantees.counted_examples(18, 12, one, two)
    assert problem == "" and said.startswith("18 examples counted at step 6, those its steps read")
    assert "the uninterrupted run counts 12" in said
    # A task that splits its global batch: the same count as the uninterrupted run.
    assert guarantees.counted_examples(12, 12, one, {step: 1 + 1 for step in range(4, 7)}) == (
        "", "12 examples counted at step 6, those its steps read")
    problem, _ = guarantees.counted_examples(24, 12, one, two)
    assert problem == ("at step 6 the run at two replicas counts 24 examples read, but its steps "
                       "read 18 (6 in steps 1-3 on one replica, 12 in steps 4-6 on two); the "
                       "uninterrupted run 12")
    assert guarantees.counted_examples(18, 14, one, two)[0] == (
        "at step 6 the uninterrupted run counts 14 examples read, but its steps read 12")
    assert guarantees.counted_examples(0, 0, one, two)[1].startswith("no examples counted")
    assert "counts None examples read" in guarantees.counted_examples(None, 12, one, two)[0]


def test_the_command_check_expects_model_gardens_steps_and_says_which_differ():
    # `--command` (bench/model_garden_zoo/command.py): the YAML's trainer settings give the steps
    # Model Garden's trainer ends loops, evaluates, saves and keeps checkpoints at, for a run that
    # restores the initial checkpoint of step 0, which max_to_keep retires like any other.
    from bench.model_garden_zoo import command

    expected = command.schedule(command.TRAINER)
    assert expected == {"loops": [2, 4, 6, 8], "evaluations": [6, 8], "checkpoints": [4, 8],
                        "kept": [4, 8]}
    assert command.schedule(dict(command.TRAINER, train_steps=7, max_to_keep=5)) == {
        "loops": [2, 4, 6, 7], "evaluations": [6, 7], "checkpoints": [4, 7], "kept": [0, 4, 7]}
    same = {"kept": [4, 8], "evaluations": [6, 8]}
    assert command.step_reasons(expected, {"ctl": same, "train_lib": same}) == {
        "checkpoints": "", "evaluations": ""}
    every_loop = {"kept": [6, 8], "evaluations": [8]}
    assert command.step_reasons(expected, {"ctl": every_loop, "train_lib": same}) == {
        "checkpoints": "checkpoints kept ctl [6, 8], the YAML's [4, 8]",
        "evaluations": "evaluations at steps ctl [8], the YAML's [6, 8]"}
    # The variant's overrides as one YAML: later ones win, nested dicts merge, lists are replaced.
    assert command.merged([{"task": {"model": {"a": 1, "b": [1, 2]}}, "trainer": {"x": 1}},
                           {"task": {"model": {"b": [3], "c": (4,)}}}]) == {
        "task": {"model": {"a": 1, "b": [3], "c": [4]}}, "trainer": {"x": 1}}
    # The best checkpoint: the experiment's own, else the eval loss, else the first metric.
    own = {"best_checkpoint_export_subdir": "best_ckpt", "best_checkpoint_eval_metric": "accuracy",
           "best_checkpoint_metric_comp": "higher"}
    assert command.best_checkpoint(own, ["validation_loss"]) == own
    assert command.best_checkpoint({}, ["accuracy", "validation_loss"])[
        "best_checkpoint_eval_metric"] == "validation_loss"
    assert command.best_checkpoint({}, ["total_loss", "AP"])["best_checkpoint_metric_comp"] == "lower"
    assert command.best_checkpoint({}, ["final_f1"])["best_checkpoint_metric_comp"] == "higher"
    assert command.best_checkpoint({}, []) == {}


def test_the_ctl_train_column_appears_once_a_row_is_checked_and_a_failure_says_why():
    with open(page.DOCS_RESULTS) as f:
        results = json.load(f)
    for row in results["rows"]:  # No row checked: no column.
        for key in [key for key in row if key.startswith("command")]:
            del row[key]
    assert "ctl.train" not in page.render(results)
    results["rows"][0].update(command=False, command_reason="checkpoints kept ctl [6, 8], the YAML's [4, 8]")
    results["rows"][1].update(command=True, command_reason="")
    rendered = page.render(results)
    table = [line for line in rendered.splitlines() if line.startswith("| ")]
    assert {line.count(" | ") for line in table} == {14}  # Fifteen cells in every line.
    header, rows = table[0], table[2:]  # table[1]: the line under the header.
    assert header.split(" | ")[7] == "ctl.train"
    assert rows[0].split(" | ")[7] == "**no**" and rows[1].split(" | ")[7] == "yes"
    assert rows[2].split(" | ")[7] == "-"
    assert "ctl.train: checkpoints kept ctl [6, 8], the YAML's [4, 8]" in rows[0]
    assert "**ctl.train**" in rendered and "ctl.FaultTolerance.seed=1" in rendered


@pytest.mark.slow  # Imports Model Garden and writes the variant's generated files.
def test_the_command_checks_yaml_is_the_variant_model_garden_builds_from_its_overrides(tmp_path):
    # The YAML a user would keep holds what the zoo's rows apply as a list of overrides: Model
    # Garden's own parser (its train.py's) builds the same config from it.
    import argparse

    from official.core import train_utils

    from bench.model_garden_zoo import command, data, registry, variants
    from ctl.adapters import model_garden

    registry.import_all()
    for experiment in ("image_classification", "bert/sentence_prediction"):
        config = command.config(experiment, str(tmp_path / "data"), ["validation_loss"], eval_steps=2)
        path = command.write_yaml(str(tmp_path / f"{experiment.replace('/', '_')}.yaml"), config)
        parsed = train_utils.parse_configuration(argparse.Namespace(
            experiment=experiment, config_file=[path], tpu=None, tf_data_service=None,
            params_override=None), print_return=False)
        overrides = (variants.overrides(experiment, command.TRAINER["train_steps"])
                     + data.data_overrides(experiment, str(tmp_path / "data"))
                     + [{"trainer": config["trainer"]}])
        if "init_checkpoint" in config["task"]:
            overrides.append({"task": {"init_checkpoint": ""}})
        assert parsed.as_dict() == model_garden.experiment_config(
            experiment, params_override=overrides).as_dict()
        assert parsed.trainer.checkpoint_interval == 4 and parsed.trainer.validation_steps == 2
        assert parsed.trainer.best_checkpoint_export_subdir == "best_ckpt"


@pytest.mark.slow  # Imports Model Garden, writes the generated files and builds a tiny BERT.
def test_the_command_checks_initial_checkpoint_is_model_gardens_layout_without_rng(tmp_path):
    # Both trainers' dropout generators start from the seed, as in a model dir of Model Garden's:
    # with `rng` in it, ctl restored the states this writer made, which differ where a layer is
    # built on the model's first call (BERT's next-sentence head: here after its initializers
    # drew their seeds; in both trainers in their first step, with no initializer run).
    import tensorflow as tf

    from bench.model_garden_zoo import command, registry
    from ctl.core import checkpoint_contents

    registry.import_all()
    experiment = "bert/pretraining"
    config = command.config(experiment, str(tmp_path / "data"), ["validation_loss"])
    command.write_initial_checkpoint(experiment, config, [str(tmp_path / "model")])
    graph = checkpoint_contents.SavedGraph(tf.train.load_checkpoint(str(tmp_path / "model" / "ckpt-0")))
    assert sorted(graph.root_children()) == ["global_step", "model", "optimizer", "save_counter"]


def test_the_command_checks_reasons_say_what_empty_dirs_and_model_gardens_eval_found(tmp_path):
    from bench.model_garden_zoo import command
    from ctl.core import evaluation

    assert command.scratch_reason(None) == ""
    assert command.scratch_reason(0.02).startswith("from empty model dirs as well (max relative")
    assert command.scratch_reason(0.0).startswith(
        "from empty model dirs they are the same (max relative difference 0.0e+00): the initial "
        "checkpoint moves Model Garden's dropout draws, not ctl's")
    # The ops come from ctl's own line (ctl.core.evaluation), as its log has it.
    assert command.RANDOM_OPS_LINE in inspect.getsource(evaluation.Evaluation._look_for_random_ops)
    log = tmp_path / "ctl.log"
    log.write_text(" train | step: 2\n eval | " + command.RANDOM_OPS_LINE
                   + "RandomUniform, Multinomial), whose state lives in their kernels: ...\n")
    assert command._eval_random_ops(str(log)) == ["RandomUniform", "Multinomial"]
    log.write_text(" eval | step: 6 | loss: 1\n")
    assert command._eval_random_ops(str(log)) == []
    said = command.eval_mode_reason(8, [], ["RandomUniform"])
    assert said.startswith("Model Garden's own --mode=eval of its ckpt-8 gives ctl's numbers: the "
                           "eval step draws from stateful random ops (RandomUniform)")
    assert command.eval_mode_reason(8, ["loss 1 (ctl) vs 2 (train_lib)"], []) == (
        "Model Garden's own --mode=eval of its ckpt-8 differs from ctl's too: loss 1 (ctl) vs 2 "
        "(train_lib)")


def test_a_resume_that_is_not_bit_identical_on_the_same_data_names_the_gradients_check():
    # Only the final checkpoint differs, or a step's loss on the same data with no stateful random
    # op: Model Garden's own gradients check says whether its step repeats (run once per row:
    # cached on the row here). Other data, or no difference, is left as it is.
    import types

    from bench.model_garden_zoo import guarantees

    row = types.SimpleNamespace(
        gradients="Model Garden's own train step (...): 39 between two processes (...)")
    said = guarantees._why_not_bit_identical(row, "final checkpoint: a/b: 2 of 9 values differ")
    assert said == "final checkpoint: a/b: 2 of 9 values differ; " + row.gradients
    same_data = ("step 3's loss 1.0 (stopped process) vs 2.0 uninterrupted, on the same data (its "
                 "inputs' sum): its train step holds no stateful random op (...)")
    assert guarantees._why_not_bit_identical(row, same_data) == same_data + "; " + row.gradients
    other = "step 3's loss 1.0 (stopped process) vs 2.0 uninterrupted (its inputs' sum 1 vs 2: other data)"
    assert guarantees._why_not_bit_identical(row, other) == other
    assert guarantees._why_not_bit_identical(row, "") == ""


def test_the_gradients_check_tells_processes_that_compute_other_gradients():
    # Model Garden's own train step in several processes, from the same weights and batch (their
    # digests): the same gradients in all, or the sets they fall into and which variables differ
    # (DeepLab v3+: 2 of 12 processes, 39 variables), or starts that differ (nothing to compare).
    import numpy as np

    from bench.model_garden_zoo import guarantees

    usual = [np.array([1.0, 2.0], np.float32), np.array([3.0], np.float32),
             np.array([5.0], np.float32)]
    other = [np.nextafter(usual[0], np.float32(9)), np.nextafter(usual[1], np.float32(9)), usual[2]]
    record = {"variables": 3, "differ": [0, 0], "names": ["a", "b", "c"], "weights": "w", "batch": "x"}
    said = guarantees.gradients_sentence("e", [record] * 3, [usual, other, usual])
    assert "but 3 processes give 2 different sets (2, 1 processes): in the rarer, the gradients " \
           "of 2 variables (in the model's order a to b) differ by up to 1e-07 relative" in said
    assert guarantees.TENSORFLOW_PER_PROCESS in said
    assert said.endswith("(python -m bench.model_garden_zoo.guarantees e --gradients)")
    same = guarantees.gradients_sentence("e", [record] * 3, [usual, usual, usual])
    assert same.endswith("and 0 between 3 processes (python -m bench.model_garden_zoo.guarantees e "
                         "--gradients)")
    moved = guarantees.gradients_sentence("e", [record, {**record, "weights": "v"}], [usual, other])
    assert "did not start from the same weights and batch (2 different digests)" in moved
    # The guarantees page groups a row whose detail ends with that sentence by it.
    from bench.model_garden_zoo import guarantees_page

    rows = [{"experiment": "e", "family": "segmentation",
             "guarantees": {"kill_9": {"holds": False, "detail": "final checkpoint: ...; " + said}}}]
    assert "not on `e` (Model Garden's own train step, with no ctl code, gives their gradients one " \
           "of several ways per process)" in " ".join(guarantees_page.docs_item(rows, "kill_9").split())


@pytest.mark.slow  # Imports Model Garden and builds its image classification pipeline 7 times.
def test_the_input_check_tells_a_pipeline_that_mixes_each_replicas_batch_from_a_lost_position(tmp_path):
    """Where a step at two replicas read other data, `new_replicas` says what Model Garden's own
    pipeline gives there (`--input_at_two_replicas`): with mixup and cutmix (DeiT's), which mix
    each replica's half batch at two replicas, other global batches, the same once they are off
    (the same examples); without them, the same global batches: a run that read other data lost
    its position."""
    import importlib

    from bench.model_garden_zoo import guarantees, registry

    assert guarantees.first_other_step([1.0] * 6, [1.0, 2.0, 1.0, 1.0, 1.0, 3.0]) == 6
    assert guarantees.first_other_step([1.0] * 6, [1.0, 2.0, 1.0, 1.0, 1.0, 1.0]) is None
    assert guarantees.first_other_step([1.0] * 6, [1.0, 2.0, 1.0, 1.0, 1.0, 1.0], first=1) == 2
    importlib.import_module(registry.VISION)
    check = guarantees._input_at_two_replicas  # noqa: SLF001 (the zoo's own)
    mixup = [{"task": {"train_data": {"mixup_and_cutmix": {"mixup_alpha": 0.8}}}}]
    said = check("image_classification", str(tmp_path), mixup)
    assert "gives other global batches at two replicas than at one: step 4's inputs sum to" in said
    assert ("; with task.train_data.mixup_and_cutmix=None (turning off its mixup and cutmix, "
            "applied to each batch after batching) they are the same at steps 4-6: the same "
            "examples, mixed as one batch at one replica and as two half batches at two (python -m "
            "bench.model_garden_zoo.guarantees image_classification --input_at_two_replicas)") in said
    said = check("image_classification", str(tmp_path))
    assert "gives the same global batches at one and two replicas at steps 4-6" in said
    assert "already differ" not in said
