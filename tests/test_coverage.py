"""tools/coverage.py renders the sweep records into COVERAGE.json and COVERAGE.md (the sweeps are the isolate tests')."""

import importlib.util
import json
from pathlib import Path

import pytest
from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

ROOT = Path(__file__).parents[1]
spec = importlib.util.spec_from_file_location("coverage_tool", ROOT / "tools" / "coverage.py")
coverage = importlib.util.module_from_spec(spec)
spec.loader.exec_module(coverage)


def record(status, reason="", location=None, model_class="FooModel", seconds=1.0):
    return {
        "status": status,
        "reason": reason,
        "model_class": model_class,
        "seconds": seconds,
        "details": {"location": location},
    }


def test_the_table_counts_each_subject_and_keeps_the_failure_class():
    records = {
        "original": {
            "a": record("export-error", "ValueError: x", "transformers/models/a/modeling_a.py:3"),
            "b": record("ok"),
        },
        "dynamo-exporter": {"a": record("ok"), "b": record("timeout", "no result within 300 s")},
        "generated": {"a": record("ok"), "b": record("ok"), "d": record("export-error", "E")},
        "onnx": {"a": record("ok")},
    }
    # tools/ablation.py: `a` verifies only with cond-branches, `b` also without it
    ablations = {"cond-branches": {"a": record("export-error", "E"), "b": record("ok")}}
    data = coverage.table(records, ["a", "b", "c", "d"], ablations)
    assert data["total"] == 4
    assert data["ok"] == {"original": 1, "dynamo-exporter": 1, "generated": 2, "onnx": 1, "executorch": 0, "greedy": 0}
    rows = {row["model_type"]: row for row in data["models"]}
    assert rows["a"]["original"] == {
        "status": "export-error",
        "reason": "ValueError: x",
        "location": "transformers/models/a/modeling_a.py:3",
    }
    assert rows["c"]["generated"]["status"] == "not-run" and rows["c"]["model_class"] is None
    # ONNX export is built on torch.export: a copy that fails it is not tried; one not yet swept is not-run
    assert rows["d"]["onnx"]["status"] == "skipped" and rows["b"]["onnx"]["status"] == "not-run"
    assert rows["c"]["onnx"]["status"] == "not-run"
    text = coverage.markdown(data, {"original": 7200.0, "dynamo-exporter": 0.0, "generated": 0.0, "onnx": 0.0})
    # a sweep that has not reached every model type says so
    assert "- **generated**: 2 of 4 architectures export and match eager (50.0%; 1 not swept yet)" in text
    assert (
        "- **onnx**: 1 of 4 architectures export to ONNX and match eager in onnxruntime (25.0%; 2 not swept yet)"
        in (text)
    )
    assert (
        "| a | FooModel | **export-error**: ValueError: x `transformers/models/a/modeling_a.py:3` | ok | ok | ok |"
        " not run | – |" in text
    )
    assert "| d | FooModel | not run | not run | **export-error**: E | – | – | – |" in text
    # the ExecuTorch column, not swept: not run where the copy verifies, not tried where it does not
    assert (
        "- **executorch**: 0 of 4 architectures lower to ExecuTorch and match eager in its runtime (0.0%; 3 not"
        in text
    )
    assert f"transformers {data['transformers']}, torch {data['torch']}" in text
    # moves against the original, among the model types both columns swept
    assert data["moves"] == {"fixed": ["a"], "broken": [], "needs": {"cond-branches": ["a"]}}
    assert "passes where the original fails for 1 model types, and fails where the original passes for 0." in text
    assert "- verify only with the `cond-branches` rewrite (1; " in text and text.count("): a\n") == 1


def loops(*matches, tie=False):
    return [
        {"batch": 1, "prompt": p, "match": m, "first_difference": None if m else 3, "tie": tie, "error": None}
        for p, m in zip((1, 2, 12), matches)
    ]


def test_the_greedy_column_reads_the_generated_records():
    lm = record("ok")
    lm["details"]["greedy"] = loops(True, True, True)
    tied = record("ok")
    tied["details"]["greedy"] = loops(True, False, True, tie=True)
    wrong = record("greedy-mismatch", "batch1-prompt2: differs from step 3")
    wrong["details"]["greedy"] = loops(True, False, True)
    records = {"original": {}, "dynamo-exporter": {}, "onnx": {}}
    records["generated"] = {"lm": lm, "tied": tied, "wrong": wrong, "encoder": record("ok"), "broken": record("eager")}
    data = coverage.table(records, ["broken", "encoder", "lm", "tied", "wrong"], {})
    rows = {row["model_type"]: row["greedy"] for row in data["models"]}
    assert rows["lm"] == {"status": "ok", "reason": "3 loops, the same tokens", "location": None}
    assert rows["tied"]["status"] == "ok" and rows["tied"]["reason"].endswith("(1 at a tie within rounding)")
    assert rows["wrong"]["status"] == "greedy-mismatch"
    assert rows["encoder"]["status"] == rows["broken"]["status"] == "skipped"
    assert data["ok"]["greedy"] == 2 and data["ok"]["generated"] == 3
    text = coverage.markdown(data, {})
    assert "- **greedy**: 2 of the 3 decoder and encoder-decoder LMs whose generated programs verify" in text


def test_the_table_says_what_moved_since_an_earlier_one():
    before = {"date": "2026-01-01", "transformers": "5.24.0", "models": []}
    before["models"] = [
        {"model_type": "a", "generated": {"status": "ok"}},
        {"model_type": "b", "generated": {"status": "export-error"}},
        {"model_type": "c", "generated": {"status": "ok"}},
    ]
    records = {"original": {}, "dynamo-exporter": {}, "onnx": {}}
    records["generated"] = {"a": record("guard-rejected", "first-step"), "b": record("ok")}
    data = coverage.table(records, ["a", "b", "c"], {}, baseline=before)
    assert data["since"]["columns"]["generated"] == {"fail_now": ["a"], "pass_now": ["b"]}  # c: not swept yet
    text = coverage.markdown(data, {})
    assert "Since the table of 2026-01-01 (transformers 5.24.0):" in text
    assert "- generated: 1 passed there and fail now (a); 1 pass now (b)" in text


def test_a_model_the_generated_copy_breaks_is_named():
    records = {
        "original": {"a": record("ok")},
        "dynamo-exporter": {},
        "generated": {"a": record("mismatch", "max|diff| 1")},
        "onnx": {},
    }
    data = coverage.table(records, ["a"], {})
    assert data["moves"] == {"fixed": [], "broken": ["a"], "needs": {}}
    assert "fails where the original passes for 1 (a)." in coverage.markdown(data, {})


def test_the_committed_json_keeps_the_start_of_a_long_reason():
    entry = coverage.cell(record("export-error", "E: " + "x" * 5000))
    assert entry["reason"].startswith("E: x") and entry["reason"].endswith("…")
    assert len(entry["reason"]) == coverage.REASON_KEPT


def test_long_reasons_are_cut_and_pipes_escaped():
    cell = coverage.markdown_cell({"status": "mismatch", "reason": "a|b " + "x" * 300, "location": None})
    assert cell.startswith("**mismatch**: a\\|b ") and cell.endswith("…")
    assert len(cell) < 140


def test_a_guard_failure_shows_the_guard_line_and_whether_it_is_a_branch():
    guard = {
        "guard": "L['x'].size()[0] >= 8",
        "case": "batch1-text5",
        "location": "transformers/models/a/modeling_a.py:7",
        "line": "if x.shape[0] >= 8 or y | z:",
        "construct": "if",
        "branch": True,
    }
    found = record("guard-rejected", "Guard failed: x.size()[0] >= 8", guard["location"])
    found["details"]["guard"] = guard
    entry = coverage.cell(found)
    assert entry["guard"] == {key: guard[key] for key in ("guard", "line", "construct", "branch")}
    assert "guard" not in coverage.cell(record("export-error", "E"))  # other cells keep their three keys
    assert coverage.markdown_cell(entry) == (
        "**guard-rejected**: Guard failed: x.size()[0] >= 8 `transformers/models/a/modeling_a.py:7`"
        " (if: `if x.shape[0] >= 8 or y \\| z:`)"
    )
    outside = {**entry, "location": None, "guard": {**entry["guard"], "line": "", "construct": "outside"}}
    assert coverage.markdown_cell(outside) == (
        "**guard-rejected**: Guard failed: x.size()[0] >= 8 (guard `L['x'].size()[0] >= 8` added by torch outside the"
        " model's code)"
    )


def test_retry_and_models_select_the_records_to_check_again():
    line = {"model_type": "opt", "status": "guard-rejected"}
    assert coverage.forgotten(line, ["guard-rejected"], [])
    assert coverage.forgotten(line, [], ["opt"])
    assert coverage.forgotten(line, ["guard-rejected"], ["opt", "vits"])
    assert not coverage.forgotten(line, ["export-error"], ["opt"])
    assert not coverage.forgotten(line, [], ["vits"])


def test_an_interrupted_recheck_resumes_instead_of_forgetting_again(tmp_path):
    path = tmp_path / "generated.jsonl"
    path.write_text("".join(json.dumps({"model_type": name, "status": "ok"}) + "\n" for name in ("a", "b")))
    coverage.forget_once(path, [], ["a"])
    assert set(coverage.recorded(path)) == {"b"}
    with path.open("a") as out:  # the re-check of a was done, then the sweep was interrupted
        out.write(json.dumps({"model_type": "a", "status": "export-error"}) + "\n")
    coverage.forget_once(path, [], ["a"])  # the same command again: a stays checked
    assert coverage.recorded(path)["a"]["status"] == "export-error"
    coverage.forget_once(path, [], ["a", "b"])  # another selection forgets
    assert coverage.recorded(path) == {}


def test_columns_without_records_carry_an_earlier_tables_cells_and_say_so():
    earlier = {
        "date": "2026-01-01",
        "transformers": "5.24.0",
        "moves": {"needs": {"cond-branches": ["a"]}},
        "models": [
            # a table from before the executorch column
            {
                "model_type": name,
                "model_class": "FooModel",
                **{column: {"status": status} for column in coverage.DEFAULT_COLUMNS},
            }
            for name, status in (("a", "ok"), ("b", "ok"), ("c", "skipped"))
        ],
    }
    records = {"original": {}, "dynamo-exporter": {}, "onnx": {}}
    records["generated"] = {"a": record("ok"), "b": record("guard-rejected", "first-step"), "c": record("ok")}
    data = coverage.table(records, ["a", "b", "c"], {}, carry=earlier)
    rows = {row["model_type"]: row for row in data["models"]}
    assert data["carried"] == {"date": "2026-01-01", "columns": ["original", "dynamo-exporter", "onnx", "ablations"]}
    assert rows["a"]["original"] == {"status": "ok"} and rows["a"]["onnx"] == {"status": "ok"}
    assert rows["b"]["onnx"]["status"] == "skipped"  # ONNX is built on torch.export, which b now fails
    assert rows["c"]["onnx"]["status"] == "not-run"  # c verifies now: not tried in ONNX yet
    assert data["moves"]["broken"] == ["b"] and data["moves"]["needs"] == {"cond-branches": ["a"]}
    text = coverage.markdown(data, {})
    assert "(33.3%; carried over from the table of 2026-01-01, not re-swept with this harness)" in text
    assert "(The original's cells are carried over from 2026-01-01, measured with the earlier harness" in text
    assert "measured with the harness of 2026-01-01" in text
    # without `carry`, a column without records is not run
    assert coverage.table(records, ["a"], {})["models"][0]["original"]["status"] == "not-run"


def test_columns_without_records_keep_a_table_of_this_harness_and_its_own_carried_columns_stay_carried(tmp_path):
    earlier = {
        "date": "2026-02-02",
        "transformers": "5.24.0",
        "moves": {"needs": {"cond-branches": ["a"], "a-deleted-codemod": ["b"]}},
        "carried": {"date": "2026-01-01", "columns": ["onnx", "ablations"]},
        "models": [
            {
                "model_type": name,
                "model_class": "FooModel",
                **{column: {"status": status, "reason": "", "location": None} for column in coverage.DEFAULT_COLUMNS},
                coverage.GREEDY: {"status": greedy, "reason": "", "location": None},
            }
            for name, status, greedy in (("a", "ok", "ok"), ("b", "guard-rejected", "skipped"))
        ],
    }
    records = {column: {} for column in coverage.SWEPT}
    records["onnx"] = {"a": record("mismatch", "max|diff|=1")}
    data = coverage.table(records, ["a", "b"], {}, keep=earlier)
    rows = {row["model_type"]: row for row in data["models"]}
    whole = {"date": "2026-02-02", "cells": 2}
    assert data["kept"] == {"original": whole, "dynamo-exporter": whole, "generated": whole, "greedy": whole}
    assert data["carried"] == {"date": "2026-01-01", "columns": ["ablations"]}  # onnx is swept in this run
    assert data["moves"]["needs"] == {"cond-branches": ["a"]}  # what a deleted codemod brought is gone with it
    assert rows["a"]["generated"]["status"] == "ok" and rows["a"][coverage.GREEDY]["status"] == "ok"
    assert rows["a"]["onnx"]["status"] == "mismatch" and rows["b"]["onnx"]["status"] == "skipped"
    text = coverage.markdown(data, {column: 3600.0 * (column == "onnx") for column in coverage.SWEPT})
    assert "- kept from the table of 2026-02-02, measured with this harness" in text
    assert "original, dynamo-exporter, generated, greedy" in text
    assert "carried over" not in text.split("\n- verify only")[0]  # no column is labelled carried over
    assert "measured with the harness of 2026-01-01" in text  # the ablations still are
    assert "original (kept), dynamo-exporter (kept), generated (kept), onnx 1.0 h" in text
    # the ONNX column is swept for the copies the kept table says verify
    swept = []
    coverage_sweep = coverage.sweep
    try:
        coverage.sweep = lambda types, *args, **kwargs: swept.extend(types)
        coverage.sweep_column(
            "onnx", ["a", "b"], Path("/nonexistent"), Path("/nonexistent/generated"), 1, 1.0, earlier
        )
    finally:
        coverage.sweep = coverage_sweep
    assert swept == ["a"]
    # generated re-swept here for some model types: the ONNX column takes those, and the kept cells of the others
    (tmp_path / "generated.jsonl").write_text(json.dumps({"model_type": "b", **record("ok")}) + "\n")
    swept.clear()
    try:
        coverage.sweep = lambda types, *args, **kwargs: swept.extend(types)
        coverage.sweep_column("onnx", ["a", "b"], tmp_path, tmp_path / "generated", 1, 1.0, earlier)
    finally:
        coverage.sweep = coverage_sweep
    assert swept == ["a", "b"]
    # so does the ExecuTorch column, with its own check
    checks = []
    try:
        coverage.sweep = lambda types, path, check, **kwargs: checks.append((types, path.name, check.func))
        coverage.sweep_column("executorch", ["a", "b"], tmp_path, tmp_path / "generated", 1, 1.0, earlier)
    finally:
        coverage.sweep = coverage_sweep
    assert checks == [(["a", "b"], "executorch.jsonl", coverage.check_executorch)]
    # a column re-swept for some model types keeps the earlier cells of the others
    records["generated"] = {"b": record("ok")}
    data = coverage.table(records, ["a", "b"], {}, keep=earlier)
    rows = {row["model_type"]: row for row in data["models"]}
    assert rows["a"]["generated"]["status"] == "ok" and rows["b"]["generated"]["status"] == "ok"
    assert data["kept"]["generated"] == {"date": "2026-02-02", "cells": 1}
    text = coverage.markdown(data, {column: 3600.0 * (column in ("onnx", "generated")) for column in coverage.SWEPT})
    assert "original, dynamo-exporter, generated (1 cell, the others re-swept in this run), greedy (1 cell" in text
    assert "generated 1.0 h" in text
    # a column that table did not have (executorch), swept for some model types: nothing of it is kept
    records["executorch"] = {"a": record("ok")}
    data = coverage.table(records, ["a", "b"], {}, keep=earlier)
    rows = {row["model_type"]: row for row in data["models"]}
    assert "executorch" not in data["kept"] and rows["a"]["executorch"]["status"] == "ok"
    assert rows["b"]["executorch"]["status"] == "not-run"  # b's copy verifies (re-swept above), not lowered yet
    records["executorch"] = {}
    # an interrupted re-sweep of a column that table carried over: the cells not reached stay carried, and say so
    records["onnx"] = {}
    records["original"] = {"a": record("ok")}
    earlier["carried"]["columns"].append("original")
    data = coverage.table(records, ["a", "b"], {}, keep=earlier)
    rows = {row["model_type"]: row for row in data["models"]}
    assert "carried" not in rows["a"]["original"] and rows["b"]["original"]["carried"] == "2026-01-01"
    assert data["carried"]["cells"] == {"original": 1} and "onnx" in data["carried"]["columns"]
    text = coverage.markdown(data, {column: 0.0 for column in coverage.SWEPT})
    assert "; 1 cells carried over from the table of 2026-01-01, not re-swept with this harness yet)" in text
    assert "| b | FooModel | **guard-rejected**:  (carried over) |" in text


def test_shards_split_the_model_types_into_disjoint_interleaved_slices():
    types = [f"t{i:02d}" for i in range(10)]
    slices = [coverage.shard(list(reversed(types)), f"{k}/3") for k in (1, 2, 3)]
    assert slices[0] == ["t00", "t03", "t06", "t09"] and slices[1] == ["t01", "t04", "t07"]
    assert sorted(sum(slices, [])) == types
    for bad in ("0/3", "4/3", "2", "a/b"):
        try:
            coverage.shard(types, bad)
        except ValueError as error:
            assert str(error).startswith(f"--shard {bad}: ")
        else:
            raise AssertionError(bad)


def _write_records(directory, column, records):
    directory.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"model_type": name, **line}) + "\n" for name, line in records.items()]
    (directory / f"{column}.jsonl").write_text("".join(lines))


def test_merged_shards_give_the_same_table_bytes_as_one_sweep_of_the_same_records(tmp_path):
    types = sorted(CONFIG_MAPPING_NAMES)[:40]
    statuses = ("ok", "export-error", "guard-rejected", "ok")
    every = {name: record(statuses[i % 4], f"reason {i}", seconds=float(i)) for i, name in enumerate(types)}
    _write_records(tmp_path / "one", "generated", every)
    _write_records(tmp_path / "one", "without-cond-branches", {types[0]: record("export-error")})
    for k in (1, 2):
        mine = coverage.shard(types, f"{k}/2")
        _write_records(tmp_path / f"shard{k}", "generated", {name: every[name] for name in reversed(mine)})
    _write_records(tmp_path / "shard1", "without-cond-branches", {types[0]: record("export-error")})
    for out in ("out-one", "out-merged"):
        (tmp_path / out).mkdir()
    assert coverage.main(["--render-only", "--work", str(tmp_path / "one"), "--out", str(tmp_path / "out-one")]) == 0
    merged = ["--merge", str(tmp_path / "shard1"), str(tmp_path / "shard2")]
    assert coverage.main([*merged, "--work", str(tmp_path / "work"), "--out", str(tmp_path / "out-merged")]) == 0
    for name in ("COVERAGE.json", "COVERAGE.md"):
        assert (tmp_path / "out-one" / name).read_bytes() == (tmp_path / "out-merged" / name).read_bytes()
    # a type two shards both recorded is an error, not a silent pick
    _write_records(tmp_path / "shard2", "without-cond-branches", {types[0]: record("ok")})
    with pytest.raises(ValueError, match=f"{types[0]} is recorded in without-cond-branches.jsonl of two shards"):
        coverage.merge([tmp_path / "shard1", tmp_path / "shard2"], tmp_path / "work")


def test_compare_lists_the_types_that_moved_between_two_tables():
    def table_of(version, cells):
        rows = [
            {"model_type": name, **{column: {"status": status} for column in coverage.COLUMNS}}
            for name, status in cells.items()
        ]
        ok = {column: sum(status == "ok" for status in cells.values()) for column in coverage.COLUMNS}
        return {"transformers": version, "date": "2026-12-01", "ok": ok, "models": rows}

    old = table_of("5.24.0", {"a": "ok", "b": "export-error", "gone": "ok"})
    new = table_of("5.25.0", {"a": "export-error", "b": "ok", "added": "ok"})
    text = coverage.compare(old, new)
    assert text.splitlines()[0] == "transformers 5.24.0 (2026-12-01) -> 5.25.0 (2026-12-01)"
    assert "model types: 1 new (added), 1 gone (gone)" in text
    assert "generated: 2 -> 2 ok; 1 fail now (a); 1 pass now (b)" in text
    # a column the new table did not sweep (a release swept for the generated column only) is said so, not 0 ok
    for row in new["models"]:
        row["onnx"] = {"status": "not-run"}
    assert "onnx: not swept in the new table" in coverage.compare(old, new)
    # where the generated copy fails, an unswept runtime column says "skipped": still not swept
    new["models"][0]["onnx"] = dict(coverage.SKIPPED)
    assert "onnx: not swept in the new table" in coverage.compare(old, new)
    new["models"][1]["onnx"] = {"status": "ok", "reason": "", "location": None}
    assert "onnx: not swept in the new table" not in coverage.compare(old, new)


def test_configuration_types_without_a_model_class_are_counted_apart():
    """A sub-model's configuration (sam_mask_decoder) has no model class: nothing to export, not an architecture."""
    no_class = record("build", "LookupError: no model class for SamMaskDecoderConfig in the auto mappings or its ...")
    records = {subject: {"a": record("ok"), "m": no_class} for subject in ("original", "dynamo-exporter", "generated")}
    data = coverage.table(records, ["a", "m"], {})
    assert data["total"] == 1 and data["configurations"] == ["m"]
    text = coverage.markdown(data, {})
    assert "- **generated**: 1 of 1 architectures export and match eager (100.0%)" in text
    assert "- counted apart: 1 configuration types with no model class of their own" in text
    assert "| m | FooModel | **build**: LookupError: no model class for SamMaskDecoderConfig" in text


def test_a_table_without_the_original_column_does_not_claim_the_generated_copy_equals_it():
    """A release swept for the generated column only: no '0 model types' where the original was never run."""
    swept = {"generated": {"a": record("ok"), "b": record("export-error", "boom")}}
    text = coverage.markdown(coverage.table(swept, ["a", "b"], {}), {})
    assert "The original was not swept" in text
    assert "passes where the original fails" not in text
    both = {**swept, "original": {"a": record("export-error", "boom"), "b": record("export-error", "boom")}}
    text = coverage.markdown(coverage.table(both, ["a", "b"], {}), {})
    assert "The generated copy passes where the original fails for 1 model types" in text


def test_a_run_that_ablates_one_codemod_keeps_the_others_findings_with_their_dates():
    earlier = {
        "date": "2026-02-02",
        "transformers": "5.24.0",
        "moves": {"needs": {"cond-branches": [], "shift-by-one": ["b"]}},
        "carried": {"date": "2026-01-01", "columns": ["ablations"]},
        "models": [
            {
                "model_type": name,
                "model_class": "FooModel",
                **{column: {"status": "ok", "reason": "", "location": None} for column in coverage.DEFAULT_COLUMNS},
                coverage.GREEDY: {"status": "skipped", "reason": "", "location": None},
            }
            for name in ("a", "b")
        ],
    }
    records = {column: {} for column in coverage.SWEPT}
    ablations = {"flip-unfolded": {"a": record("export-error", "E")}, "shift-by-one": {"b": record("ok")}}
    data = coverage.table(records, ["a", "b"], ablations, keep=earlier)
    # flip-unfolded and shift-by-one measured in this run (shift-by-one's earlier finding replaced), cond-branches held
    assert data["moves"]["needs"] == {"cond-branches": [], "flip-unfolded": ["a"], "shift-by-one": []}
    assert data["ablation_dates"]["cond-branches"] == {"date": "2026-01-01", "harness": "earlier"}
    assert data["ablation_dates"]["flip-unfolded"]["harness"] == "this"
    text = coverage.markdown(data, {column: 0.0 for column in coverage.SWEPT})
    lines = {line.split("`")[1]: line for line in text.splitlines() if line.startswith("- verify only with")}
    assert "measured with the harness of 2026-01-01" in lines["cond-branches"]
    assert "measured" not in lines["flip-unfolded"].split("`python tools/ablation.py flip-unfolded`")[1].split(":")[0]
    assert lines["flip-unfolded"].endswith(": a")
    # a later run that ablates nothing keeps each codemod's own date
    again = coverage.table(records, ["a", "b"], {}, keep=data)
    assert again["ablation_dates"] == data["ablation_dates"]
    assert again["moves"]["needs"] == data["moves"]["needs"]
