"""The closing lines of a training run (`ctl.run_end`): the best it states is the run's best, or says
that it is the best so far and what decides the run's. In-process, over a model dir's real files."""

import json

from ctl.hooks.best import BEST_DIR, BEST_RECORD_FILE
from ctl.run_end import say_done
from ctl.model_dir import ModelDir, write_json


def said(caplog, directory, step):
    caplog.clear()
    say_done(directory, step, {"AP": 0.05})
    return [record.getMessage() for record in caplog.records if record.getMessage().startswith("best")]


def evaluation(directory, step, value, sidecar=False):
    """An evaluation on record: the trainer's in-line one (`metrics.jsonl`) or the sidecar's."""
    path = directory.sidecar_metrics_file if sidecar else directory.metrics_file
    line = ({"checkpoint": f"ckpt-{step}", "number": step, "step": step, "results": {"AP": value}} if sidecar
            else {"kind": "eval", "step": step, "AP": value})
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")


def test_the_best_is_the_runs_once_the_final_step_is_evaluated(tmp_path, caplog):
    caplog.set_level("INFO", logger="ctl")
    directory = ModelDir(str(tmp_path))
    directory.create()
    (tmp_path / "eval").mkdir()
    (tmp_path / BEST_DIR).mkdir()
    # The trainer evaluated step 250 in-line, then stepped aside for a sidecar; it ends at step 300.
    evaluation(directory, 250, 0.0567)
    write_json(directory.file(BEST_DIR, BEST_RECORD_FILE),
               {"metric": "AP", "higher_is_better": True, "value": 0.0567, "step": 250,
                "path": directory.file(BEST_DIR, "ckpt-250", "ckpt")})
    lines = said(caplog, directory, 300)
    assert len(lines) == 1 and lines[0].startswith("best so far: AP = 0.0567 at step 250"), lines
    assert "step 300 is not evaluated yet" in lines[0] and "decides the run's best" in lines[0], lines
    # Once the sidecar evaluated step 300 (and kept the better checkpoint), the line is the run's best.
    evaluation(directory, 300, 0.07, sidecar=True)
    write_json(directory.file(BEST_DIR, BEST_RECORD_FILE),
               {"metric": "AP", "higher_is_better": True, "value": 0.07, "step": 300,
                "path": directory.file(BEST_DIR, "ckpt-300", "ckpt")})
    best = directory.file(BEST_DIR, "ckpt-300", "ckpt")
    assert said(caplog, directory, 300) == [f"best: AP = 0.07 at step 300: {best}"]


def test_in_a_bucket_the_closing_reads_are_made_side_by_side(gcs, gcs_dir, tmp_path, caplog):
    # Each read of the closing lines is a round trip: the best checkpoint's record and the
    # exporters' records (a listing) are read at once, as the others are, not one after the other.
    caplog.set_level("INFO", logger="ctl")
    directory = ModelDir(gcs_dir)
    log = tmp_path / "requests.jsonl"
    gcs.set_latency(300)
    gcs.log_requests(str(log))
    try:
        say_done(directory, 300, {"AP": 0.05})
    finally:
        gcs.log_requests(None)
        gcs.set_latency(0)
    requests = [json.loads(line) for line in log.read_text().splitlines()]
    best = [r for r in requests if BEST_RECORD_FILE in r["path"] and BEST_DIR in r["path"]
            and "export" not in r["path"]]
    listing = [r for r in requests if r["method"] == "GET" and "export%2F" in r["path"]
               and "prefix=" in r["path"] and "maxResults" not in r["path"]]  # The glob.
    assert best and listing, [r["path"] for r in requests]
    assert any(a["start"] < b["end"] and b["start"] < a["end"] for a in best for b in listing)
