"""The docs page of the zoo, generated from the results file.

    python -m bench.model_garden_zoo.page [--results=docs/how-to/model-garden-zoo.json]

Writes docs/how-to/model-garden-zoo.md: what a row proves, one row per
registered experiment, and what each tiny variant pins beyond size. The run's
record (commit, host load, wall and CPU time) is `record(results)`, kept in
bench/README.md.
"""

import argparse
import json
import os
import re
import statistics
import sys
from typing import Optional

from bench.model_garden_zoo import command, compare, variants
from bench.model_garden_zoo import guarantees_page

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS_RESULTS = os.path.join(ROOT, "docs", "how-to", "model-garden-zoo.json")
PAGE = os.path.join(ROOT, "docs", "how-to", "model-garden-zoo.md")
# Its "*Model Garden*" items (`guarantees_page.docs_items`) are written from the results too.
GUARANTEES_PAGE = os.path.join(ROOT, "docs", "explanation", "guarantees.md")


def _mark(value) -> str:
    return {True: "yes", False: "**no**", None: "-"}[value]


def _seconds(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def _loss(row) -> str:
    if row.get("max_rel_loss_diff") is None:
        return "-"
    if row.get("bit_identical_loss"):
        return "yes, bit-identical"
    return f"{_mark(row['same_loss'])} ({row['max_rel_loss_diff']:.1e})"


def _eval(row) -> str:
    if not row.get("eval"):
        return "-"
    names = ", ".join(sorted(row["eval"]))
    if row.get("bit_identical_eval"):
        return f"yes, bit-identical ({names})"
    return f"{_mark(row['same_eval'])} ({names})"


def _export(row) -> str:
    """The export check's answer (bench/model_garden_zoo/export.py): "-" where it was not run."""
    if row.get("export") == "fails" and GARDEN_FAILS_TOO in (row.get("export_reason") or ""):
        return "fails, as Model Garden's own"  # ctl's line says why (ctl.adapters.model_garden_serving).
    return {None: "-", "serves": "serves", "no module": "no module"}.get(row.get("export"),
                                                                       "**fails**")


# What ctl's refusal says when Model Garden's own export of the model fails the same way
# (`ctl.adapters.model_garden_serving`; tests/test_model_garden_export.py runs both).
GARDEN_FAILS_TOO = "Model Garden's own export"


def _command(row) -> str:
    """The command check's answer (bench/model_garden_zoo/command.py): "-" where it was not run;
    with ctl's time from launch to its first loop's end over train_lib's (`start`)."""
    said = {None: "-", True: "yes"}.get(row.get("command"), "**no**")
    reason = row.get("command_reason") or ""
    if row.get("command") is False and command.SAME_FROM_SCRATCH in reason:
        said = "**no** (ctl = Model Garden's own run from empty dirs)"
    elif row.get("command") is False and command.SAME_AS_ITS_EVAL in reason:
        said = "**no** (ctl = Model Garden's own --mode=eval)"
    ratio = start_ratio(row)
    cpu = row.get("command_process_cpu_s") or {}
    said = said if ratio is None else f"{said}, start {ratio:.2f}x"
    if cpu.get("ctl") and cpu.get("train_lib"):
        said += f", CPU {cpu['ctl'] / cpu['train_lib']:.2f}x"
    return said


def start_ratio(row) -> Optional[float]:
    """ctl's seconds from launch to the end of its first train loop over train_lib's, in the
    command check (`command_first_loop_s`); None where either is missing."""
    seconds = row.get("command_first_loop_s") or {}
    ctl, garden = seconds.get("ctl"), seconds.get("train_lib")
    return ctl / garden if ctl and garden else None


def _starts(rows) -> str:
    """One sentence on the command check's start ratios over the rows that have one."""
    ratios = sorted(r for r in map(start_ratio, rows) if r is not None)
    if not ratios:
        return ""
    cpu = sorted(c["ctl"] / c["train_lib"] for c in (r.get("command_process_cpu_s") or {} for r in rows)
                 if c.get("ctl") and c.get("train_lib"))
    return (f" From launch to the end of the first train loop, `python -m ctl.train` took a median "
            f"**{statistics.median(ratios):.2f}x** Model Garden's train.py on {len(ratios)} rows "
            f"({ratios[0]:.2f}x to {ratios[-1]:.2f}x; at or under 1.0x on "
            f"{sum(r <= 1.0 for r in ratios)}), each in its own process (the ctl.train column's "
            "\"start\", wall time on a shared host)" + (
                f"; its whole process used a median {statistics.median(cpu):.2f}x train.py's CPU "
                f"seconds on {len(cpu)} rows ({cpu[0]:.2f}x to {cpu[-1]:.2f}x: \"CPU\")" if cpu else "")
            + ".")


def render(results) -> str:
    rows = results["rows"]
    # The `ctl.train` column once any row has been run through the command (`--command`).
    commands = any("command" in row for row in rows)
    trained = sum(bool(r["trains"]) for r in rows)
    same = sum(bool(r["trains"] and r["same_loss"] and r["same_eval"]) for r in rows)
    lines = [
        "---",
        f"# The table's {'fifteen' if commands else 'fourteen'} columns take the page's width: no "
        "navigation beside it (mkdocs-material).",
        "hide:",
        "  - navigation",
        "  - toc",
        "---",
        "",
        "# Model Garden's zoo on ctl",
        "",
        "<!-- Generated by `python -m bench.model_garden_zoo.page` from model-garden-zoo.json: "
        "do not edit. -->",
        "",
        "**What a row proves.** One registered experiment, trained twice from the same initial "
        "checkpoint on the same generated files: by ctl (`ctl.ModelGardenTask`) and by Model "
        "Garden's own `official.core.train_lib.run_experiment`. *Same loss* and *same eval* "
        "yes: ctl ran the experiment's own model, input pipeline, losses, optimizer and "
        "evaluation step for step as Model Garden's trainer does (every step's training loss "
        f"within a relative {compare.LOSS_TOLERANCE:g}, every eval metric within "
        f"{compare.EVAL_TOLERANCE:g}). *Same weights: no* means the trained weights are not "
        "equal bit for bit while the losses and metrics are: the reason names the first weight "
        "that differs, in how many values and by how much (a few values, by 1e-8 or less).",
        "",
        f"Every experiment registered with Model Garden's `exp_factory` here ({results['registered']}, "
        "listed at run time), its tiny variant trained "
        f"{results['steps']} steps. **{trained} of {len(rows)} train on ctl; {same} of {len(rows)} "
        "with Model Garden's numbers.** Where a row's numbers differ, `train_lib` "
        "runs again from the same checkpoint, files and seed, and its train dataset is built "
        "again after the same seed: the reason says when Model Garden does not reproduce itself. "
        "When the rows were measured, on which commit and under what host load: `bench/README.md` "
        "in the repository, \"Model Garden zoo runs\" (the seconds per step compare the two "
        "trainers on one row, not rows with each other)." + _starts(rows),
        "",
        "Run it yourself (the `model_garden` extra brings `tensorflow-recommenders` for the "
        "ranking experiments):",
        "",
        "<!-- docs-test: skip (trains two detection models; tests/test_model_garden_zoo.py runs "
        "the command) -->",
        "```sh",
        "pip install -e '.[model_garden]'",
        "python -m bench.model_garden_zoo --experiments=retinanet_resnetfpn_coco --steps=6",
        "```",
        "",
        '<div class="compact-table" markdown>',  # 14-15 columns: narrower cells (docs/stylesheets/extra.css).
        "",
        "| experiment | family | trains | same loss (max rel. diff) | same eval | same weights "
        "| export" + (" | ctl.train" if commands else "") + " | ctl s/step | train_lib s/step "
        "| kill -9 | SIGTERM | sidecar | 2 replicas | reason |",
        "|" + " --- |" * (15 if commands else 14),
    ]
    for row in rows:
        reason = "; ".join(filter(None, [row.get("reason"), row.get("weights_difference") and
                                         f"weights differ: {row['weights_difference']}",
                                         row.get("export_reason") and
                                         f"export: {row['export_reason']}",
                                         row.get("command_reason") and
                                         f"ctl.train: {row['command_reason']}"]))
        reason += f" ({row['determinism_note']})" if row.get("determinism_note") else ""
        reason = "; ".join(filter(None, [reason, guarantees_page.reason(row)]))
        reason = re.sub(r"https?://\S+", "(link)", reason)  # A cell names the problem, not its web page.
        lines.append(
            f"| `{row['experiment']}` | {row.get('family', '')} | {_mark(row['trains'])} | {_loss(row)} "
            f"| {_eval(row)} | {_mark(row.get('same_weights'))} | {_export(row)} "
            + (f"| {_command(row)} " if commands else "") +
            f"| {_seconds(row['ctl_s_per_step'])} "
            f"| {_seconds(row['train_lib_s_per_step'])} | {guarantees_page.cells(row)} "
            f"| {reason.replace('|', '/')} |")
    lines += ["", "</div>", "", *guarantees_page.section(rows)]
    lines += [
        "",
        "## How a row is measured",
        "",
        "- **One start.** The experiment's model and optimizer are built once from a fixed seed and "
        "saved as step 0 in both model dirs, in Model Garden's layout (`global_step`, `model`, "
        "`optimizer`); each trainer restores it as the run it continues.",
        "- **The same inputs.** The same generated files in the experiment's own format, read by its "
        "own decoders, parsers and augmentations, with one shuffle seed; the same global seed before "
        "each run; `tf.config.experimental.enable_op_determinism()` unless the row says otherwise.",
        "- **Strategies.** Each as its users run it: ctl under its default (`--strategy=default`), "
        "`train_lib` under the strategy Model Garden's `train.py` makes from the experiment's "
        "runtime (here a `MirroredStrategy` of the one CPU), one replica each.",
        "- **Loss.** Both train in loops of one step: each step's training loss is in the run's "
        "summaries (`loss` for ctl, `training_loss` for `train_lib`).",
        "- **Eval.** One evaluation of the whole eval set at the last step (of "
        f"{compare.EVAL_STEPS} batches where the set never ends): each metric "
        "`train_lib` reports (COCO AP, mIoU, accuracy, BLEU, AUC, ...) and the eval loss "
        "(`train_lib`'s `validation_loss` against ctl's `loss`; where the task's own aggregation "
        "reports a `loss`, as Model Garden's `mock` does, both report that one as `loss`). "
        "Where the experiment's trainer keeps its best checkpoint "
        "(`trainer.best_checkpoint_export_subdir`) and reports `best_<metric>`, the ctl run keeps "
        "one by the same metric (`ctl.hooks.BestCheckpoint`) and its record's value is compared.",
        "- **Weights.** The trained model's weights compared bit for bit; where they differ, the "
        "row names the first weight that does and by how much.",
        "- **Export** (`--export`, bench/model_garden_zoo/export.py). A ctl run of the tiny variant "
        f"({results.get('export_steps', '-')} steps from the same initial checkpoint) with "
        "`ctl.hooks.FinalExporter`, which exports through Model Garden's own export module for the "
        "experiment (`ctl.ModelGardenTask.serving_signatures`); the SavedModel, loaded with "
        "`tf.saved_model.load`, must give on one eval batch what the same module gives around a "
        "model restored from the run's final checkpoint (every output within a relative 1e-4). "
        "\"serves\": it does; \"no module\": Model Garden has no export module for the family "
        "(the reason says what ctl does instead); \"fails, as Model Garden's own\": the module "
        "cannot serve this model, and Model Garden's own export of it fails the same way (the "
        "reason says why and what to change); "
        "\"-\": not checked.",
        *([_command_bullet(results)] if commands else []),
        "- **Seconds per step.** Each trainer's `steps_per_second` summary, inverted: the wall "
        "time from the end of one train loop (of one step) to the end of the next, so the step "
        "and the trainer's own work between loops (its summaries; `train_lib`'s orbit flushes them "
        "after every loop); the median over loops 2 to K, the first (which traces) left out on "
        "both sides. The two trainers run one after the other in the row's process.",
        "",
        "## The tiny variants",
        "",
        "`bench/model_garden_zoo/variants.py` makes each variant by overrides only, from what the "
        "experiment's config holds (its task config's class, its backbone's type): images of "
        f"{variants.IMAGE['classification']} px (classification), {variants.IMAGE['detection']} px "
        f"(detection), {variants.IMAGE['segmentation']} px (segmentation), clips of "
        f"{variants.FRAMES} frames of {variants.IMAGE['video']} px; the smallest backbone of the "
        f"same kind; heads and decoders of {variants.SMALL_FILTERS} filters; one transformer layer "
        f"of width 32, sequences of {variants.SEQ_LENGTH} tokens; four ranking features. Beyond "
        "size, each variant pins:",
        "",
    ]
    lines += [f"- {setting}: {why}." for setting, why in variants.PINNED.items()]
    return "\n".join(lines) + "\n"


def _command_bullet(results) -> str:
    """What the ctl.train column checks (bench/model_garden_zoo/command.py)."""
    trainer = results.get("command_trainer") or command.TRAINER
    return (
        "- **ctl.train** (`--command`, bench/model_garden_zoo/command.py). The tiny variant as one "
        "YAML file with trainer settings of its own (" + ", ".join(
            f"`{key}: {value}`" for key, value in trainer.items()) + "; a best checkpoint in "
        "`best_ckpt/` by the experiment's own metric, else `validation_loss`, else the first "
        "metric its evaluation reports), run by `python -m ctl.train --experiment=NAME "
        "--mode=train_and_eval --model_dir=DIR --config_file=NAME.yaml` and by Model Garden's "
        "train.py steps on the same flags, each in its own process, from one initial checkpoint "
        "in Model Garden's layout (without `rng`, the states of the generators a seeded ctl "
        "run's dropout draws from: each trainer's start from the seed, as in a model dir of "
        f"Model Garden's). ctl's one flag more, `{command.SEED_BINDING}`, "
        "seeds it: a YAML holds no seed; Model Garden's side is seeded the same way. \"start\": "
        "ctl's seconds from its process's launch to the end of its first train loop (the wall "
        "time of that loop's summaries) over Model Garden's, each importing what its own command "
        "imports (ctl.train the registries up to the experiment's, Model Garden the family's "
        "train.py's), run one after the other in the same row; \"CPU\": the user and system "
        "seconds of ctl's whole process over Model Garden's (wall time moves with the host's "
        "load, CPU time much less). \"yes\": "
        f"the training loss at each loop's end within a relative {compare.LOSS_TOLERANCE:g} of "
        f"Model Garden's, every evaluation's metrics in `validation/` within "
        f"{compare.EVAL_TOLERANCE:g}, and the checkpoints kept (and the last one's top-level "
        "objects), the steps evaluated and the best checkpoint's step, top-level objects and "
        "`info.json` those of Model Garden's run and of the YAML; \"**no**\": the reason says "
        "which are not; \"**no** (ctl = Model Garden's own ...)\": they differ from Model "
        "Garden's in-run numbers, and Model Garden's own run from empty model dirs, or its own "
        "`--mode=eval` of the same checkpoint, gives ctl's (the reason says why Model Garden's "
        "run moves); \"-\": not checked.")


def record(results) -> str:
    """The run's record for bench/README.md: when, on which commit, under what load."""
    load = results["load_1min"]
    updated = ("Rows measured again later, with their commit: " + ", ".join(
        f"`{name}` at `{commit}`" for name, commit in results["updated"].items()) + ". "
        if results.get("updated") else "")
    cpu = (f" The rows' processes used {results['cpu_minutes']} CPU-minutes in all (user and "
           "system time)." if results.get("cpu_minutes") else "")
    return (f"{updated}Measured at commit `{results['commit']}`, {results['started']}, in "
            f"{results['minutes']} minutes of wall time with {results.get('jobs', 1)} rows at "
            f"once, on {results['cpus']} CPU cores (the host's 1-minute load, this run and any "
            f"other jobs, {load['min']:.1f} to {load['max']:.1f}, mean {load['mean']}).{cpu}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default=DOCS_RESULTS)
    parser.add_argument("--page", default=PAGE)
    args = parser.parse_args(argv)
    with open(args.results) as f:
        results = json.load(f)
    with open(args.page, "w") as f:
        f.write(render(results))
    with open(GUARANTEES_PAGE) as f:
        text, missing = guarantees_page.docs_items(f.read(), results["rows"])
    if missing:
        print(f"{GUARANTEES_PAGE} has no item marked {missing}: not written", file=sys.stderr)
        return 1
    with open(GUARANTEES_PAGE, "w") as f:
        f.write(text)
    print(f"wrote {args.page}; the run's record for bench/README.md:\n{record(results)}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
