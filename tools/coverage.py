"""The coverage table: every model type of the installed transformers exported three ways, each isolated.

    python tools/coverage.py --baseline OLD.json   # ... and say what moved since an earlier table

    python tools/coverage.py                 # generate everything, sweep the four columns, write the table
    python tools/coverage.py --fresh         # forget earlier sweep records and start over
    python tools/coverage.py --render-only   # rewrite the table from the records already in the work directory
    python tools/coverage.py --retry build eager timeout   # check again the model types recorded with these statuses
    python tools/coverage.py --models opt vits --columns generated   # check again these model types only
                                             # (--retry/--models interrupted: the same command resumes it)
    python tools/coverage.py --shard 2/4 --work build/shard2   # one machine's quarter of the sweep, records only
    python tools/coverage.py --merge build/shard1 ... build/shard4   # their records, one table
    python tools/coverage.py --compare OLD.json NEW.json   # the model types that moved between two tables
    python tools/coverage.py --columns onnx --keep OLD.json   # re-sweep one column, keep the others' cells
    python tools/coverage.py --columns onnx --keep OLD.json --carried-only   # go on with an interrupted re-sweep
    .venv-executorch/bin/python tools/coverage.py --columns executorch --keep generated/COVERAGE.json
                                             # the ExecuTorch column, in an environment with the `executorch` extra

Steps: `exportsmith generate --all` into `build/coverage/generated`; then, for each subject of
`exportsmith.verify.check.SUBJECTS` (the original with no help, the original through transformers' DynamoExporter,
the generated copy), `verify_model` of every model type in its own child process (memory cap, timeout), records
appended to `build/coverage/<subject>.jsonl` as they come, so an interrupted run resumes where it stopped; then the
`onnx` column: `verify_onnx` (torch.onnx.export(dynamo=True) + onnxruntime) of each generated copy that verified with
torch.export (the others are `skipped`: ONNX export is built on it), and, when named in `--columns`, the
`executorch` column the same way (`verify_executorch`: lowered with XNNPACK, run in the ExecuTorch runtime); last,
`generated/COVERAGE.md` and `generated/COVERAGE.json`: one row per model type, a column each with its failure class,
totals on top, versions, date and this command. The JSON holds no timings, so the same transformers, torch and
code give the same file apart from the date. A failure caused by a shape guard (guard-rejected, or a dynamic dim the
code pins) also names the guard's line and whether it is a branch's test (`verify.guards`).
"""

import argparse
import datetime
import json
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import torch
import transformers
from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

from codemods import ALL_CODEMODS
from exportsmith.verify.check import SUBJECTS
from exportsmith.verify.isolate import JOBS, check_executorch, check_export, check_onnx, recorded, sweep
from exportsmith.verify.executorch_check import EXECUTORCH_MAX_ABS_DIFF
from exportsmith.verify.onnx_check import ONNX_MAX_ABS_DIFF
from exportsmith.verify.tasks import NO_MODEL_CLASS as NO_CLASS

ROOT = Path(__file__).resolve().parents[1]
COMMAND = "python tools/coverage.py"
TIMEOUT = 900.0  # seconds per model and subject (three dims styles, a fresh process, greedy loops)
REASON_WIDTH = 110  # characters of a failure's first line shown in the table
GUARD_LINE_WIDTH = 70  # characters of a guard's source line shown in the table
REASON_KEPT = 600  # characters of a failure's reason kept in COVERAGE.json (the sweep records hold it whole)
ONNX = "onnx"
EXECUTORCH = "executorch"  # swept only when asked: the `executorch` extra lives in an environment of its own
RUNTIMES = (ONNX, EXECUTORCH)  # built on the generated copy's torch.export programs
GREEDY = "greedy"  # not swept: read from the generated column's records
SWEPT = (*SUBJECTS, *RUNTIMES)
DEFAULT_COLUMNS = (*SUBJECTS, ONNX)
COLUMNS = (*SWEPT, GREEDY)
NO_MODEL_CLASS = f"LookupError: {NO_CLASS} "  # the reason of a configuration type that has no model class
SKIPPED = {"status": "skipped", "reason": "the generated copy does not verify with torch.export", "location": None}


def generate_all(package: Path) -> None:
    started = time.perf_counter()
    command = [sys.executable, "-m", "exportsmith", "generate", "--all", "--out", str(package)]
    subprocess.run(command, check=True)
    print(f"generated every model into {package} in {time.perf_counter() - started:.0f} s", file=sys.stderr)


def sweep_column(
    column: str, model_types: list[str], work: Path, package: Path, jobs: int, timeout: float, earlier: dict | None
) -> None:
    if column in RUNTIMES:
        # the generated cells this work directory re-swept, the others kept or carried from `earlier`
        generated = {row["model_type"]: row["generated"] for row in (earlier or {}).get("models", [])}
        generated.update(recorded(work / "generated.jsonl"))
        model_types = [name for name in model_types if generated.get(name, {}).get("status") == "ok"]
        check = partial(
            check_onnx if column == ONNX else check_executorch, package=package.name, path=str(package.parent)
        )
    else:
        check = partial(check_export, subject=column, package=package.name, path=str(package.parent))
    started = time.perf_counter()
    sweep(model_types, work / f"{column}.jsonl", check, jobs=jobs, timeout=timeout)
    print(f"swept {column} in {time.perf_counter() - started:.0f} s", file=sys.stderr)


def forgotten(record: dict, statuses: list[str], models: list[str]) -> bool:
    """Whether --retry STATUS... and --models MODEL_TYPE... (both when both are given) select a record."""
    return (not statuses or record["status"] in statuses) and (not models or record["model_type"] in models)


def recheck_note(path: Path) -> Path:
    return path.with_name(path.name + ".recheck")


def forget_once(path: Path, statuses: list[str], models: list[str]) -> None:
    """Forgets the records of `path` that --retry/--models select, once per selection: the selection stays noted
    beside the records until the column's sweep ends, so that an interrupted re-check resumes where it stopped
    instead of forgetting what it already checked again."""
    note, selection = recheck_note(path), json.dumps({"retry": sorted(statuses), "models": sorted(models)})
    if note.exists() and note.read_text() == selection:
        return
    kept = [line for line in recorded(path).values() if not forgotten(line, statuses, models)]
    path.write_text("".join(json.dumps(line) + "\n" for line in kept))
    note.write_text(selection)


def cell(record: dict | None) -> dict:
    """The committed part of one column's record of one model type."""
    if record is None:
        return {"status": "not-run", "reason": "", "location": None}
    details = record.get("details") or {}
    reason = record["reason"]
    if len(reason) > REASON_KEPT:
        reason = reason[: REASON_KEPT - 1] + "…"
    entry = {"status": record["status"], "reason": reason, "location": details.get("location")}
    guard = details.get("guard")
    if guard:  # only failures a shape guard explains carry one (the other cells keep their three keys)
        entry["guard"] = {key: guard[key] for key in ("guard", "line", "construct", "branch")}
    return entry


def greedy_cell(record: dict | None) -> dict:
    """The greedy-loop column of one model type, from its generated record: the loops its programs drove against
    generate() (only a decoder LM or an encoder-decoder LM whose programs verified gets them), else skipped."""
    loops = ((record or {}).get("details") or {}).get("greedy") or []
    if record is not None and record["status"] == "greedy-mismatch":
        return cell(record)
    if not loops:
        return {
            "status": "skipped",
            "reason": "no greedy loop: not an LM, or its programs do not verify",
            "location": None,
        }
    ties = sum(loop["tie"] and not loop["match"] for loop in loops)
    reason = f"{len(loops)} loops, the same tokens" + (f" ({ties} at a tie within rounding)" if ties else "")
    return {"status": "ok", "reason": reason, "location": None}


def since(baseline: dict | None, rows: list[dict]) -> dict | None:
    """What moved in each column against an earlier table (its COVERAGE.json): the model types that passed there and
    fail now, and the reverse."""
    if baseline is None:
        return None
    before = {row["model_type"]: row for row in baseline["models"]}
    moved = {}
    for column in COLUMNS:
        was = {name for name, row in before.items() if row.get(column, {}).get("status") == "ok"}
        now = {row["model_type"] for row in rows if row[column]["status"] == "ok"}
        swept = {row["model_type"] for row in rows if row[column]["status"] != "not-run"} & set(before)
        moved[column] = {"fail_now": sorted((was - now) & swept), "pass_now": sorted((now - was) & swept)}
    return {"date": baseline["date"], "transformers": baseline["transformers"], "columns": moved}


def moves(rows: list[dict], ablations: dict[str, dict[str, dict]]) -> dict:
    """The model types the generated copy moves from failing to passing (and back) against the original, and per
    codemod ablated by tools/ablation.py the ones that verify only with it."""
    status = {row["model_type"]: {column: row[column]["status"] for column in SWEPT} for row in rows}
    swept = [name for name, cells in status.items() if "not-run" not in (cells["original"], cells["generated"])]
    return {
        "fixed": [name for name in swept if status[name]["generated"] == "ok" != status[name]["original"]],
        "broken": [name for name in swept if status[name]["original"] == "ok" != status[name]["generated"]],
        "needs": {
            codemod: sorted(
                name
                for name, record in found.items()
                if status.get(name, {}).get("generated") == "ok" and record["status"] != "ok"
            )
            for codemod, found in sorted(ablations.items())
        },
    }


def held_ablation(earlier: dict, codemod: str, carried: bool) -> dict:
    """When and with which harness ("this" or "earlier") the earlier table's ablation of `codemod` was measured: its
    own record of it, else the date of the table's ablations (carried over from an earlier harness, or kept); all
    from an earlier harness when the earlier table is carried over."""
    held = dict((earlier.get("ablation_dates") or {}).get(codemod) or {})
    if not held:
        was = earlier.get("carried") or {}
        if "ablations" in was.get("columns", []):
            held = {"date": was["date"], "harness": "earlier"}
        else:
            held = {
                "date": (earlier.get("kept") or {}).get("ablations", {}).get("date", earlier["date"]),
                "harness": "this",
            }
    if carried:
        held["harness"] = "earlier"
    return held


def table(
    records: dict[str, dict[str, dict]],
    model_types: list[str],
    ablations: dict[str, dict[str, dict]],
    baseline: dict | None = None,
    carry: dict | None = None,
    keep: dict | None = None,
) -> dict:
    """The table of `records` (column -> model type -> sweep record). A column that has no records at all can take its
    cells from an earlier COVERAGE.json: with `carry`, one measured with an earlier harness, and the table says the
    column was not re-swept with this harness; with `keep`, one measured with this same harness (its sweep records are
    on another machine, or gone with a fresh clone), and the table says where the cells come from, while the columns
    that table itself carried over stay carried over, with their date. With `keep`, a column swept for some model
    types only (`--models`) keeps that table's cells for the others."""
    records = {column: records.get(column, {}) for column in SWEPT}  # a column never swept has no records
    earlier = carry if carry is not None else keep
    # columns without records take the earlier table's cells, if it has that column (an older table has no executorch)
    held = {column for column in SWEPT if earlier is not None and any(column in row for row in earlier["models"])}
    empty = [column for column in SWEPT if not records[column] and column in held]
    # tools/ablation.py's records of the codemods this work directory has none for (each codemod's own: a run that
    # ablates one keeps the others' findings); a codemod deleted since has nothing left to need
    codemods = {codemod.NAME for codemod in ALL_CODEMODS}
    earlier_needs = earlier.get("moves", {}).get("needs", {}) if earlier is not None else {}
    needs_held = {name: types for name, types in earlier_needs.items() if name not in ablations and name in codemods}
    if earlier_needs and needs_held:
        empty.append("ablations")
    carried, kept, resumed = {"date": None, "columns": []}, {}, []
    if carry is not None:
        carried = {"date": carry["date"], "columns": empty}
    elif keep is not None:
        was = keep.get("carried") or {"date": None, "columns": []}
        carried = {"date": was["date"], "columns": [column for column in empty if column in was["columns"]]}
        dates = {column: (keep.get("kept") or {}).get(column, {}).get("date", keep["date"]) for column in SWEPT}
        kept = {column: {"date": dates[column], "cells": 0} for column in empty if column not in carried["columns"]}
        if "ablations" in kept:
            kept["ablations"]["date"] = (keep.get("kept") or {}).get("ablations", {}).get("date", keep["date"])
        resumed = [column for column in SWEPT if records[column]]
    before = {row["model_type"]: row for row in earlier["models"]} if earlier is not None else {}
    rows = []
    for name in model_types:
        classes = {records[subject].get(name, {}).get("model_class") for subject in SUBJECTS} - {None}
        if name in before and (empty or resumed):
            classes.add(before[name].get("model_class"))
            classes.discard(None)
        row = {
            "model_type": name,
            "model_class": min(classes) if classes else None,
            **{column: cell(records[column].get(name)) for column in SWEPT},
            GREEDY: greedy_cell(records["generated"].get(name)),
        }
        taken = set(empty) & set(SWEPT) | {column for column in resumed if name not in records[column]}
        for column in taken | ({GREEDY} if "generated" in taken else set()):
            row[column] = dict(before.get(name, {}).get(column) or cell(None))
            if column in resumed and column in was["columns"] and name in before:
                # a cell of a column that table carried over: not measured with this harness, and said so
                row[column]["carried"] = was["date"]
            elif (column in kept or column in resumed) and column in held:  # a column that table had
                kept.setdefault(column, {"date": dates[column], "cells": 0})["cells"] += name in before
        for runtime in RUNTIMES:
            if runtime in taken and row[runtime]["status"] == "skipped" and row["generated"]["status"] == "ok":
                row[runtime] = cell(None)  # the copy verifies now: not tried in this runtime yet
            if (name not in records[runtime] or runtime in empty) and row["generated"]["status"] not in (
                "ok",
                "not-run",
            ):
                row[runtime] = dict(SKIPPED)
        rows.append(row)
    if "generated" in kept:
        kept[GREEDY] = dict(kept["generated"])  # read from the generated column's records
    cells = {column: sum("carried" in row[column] for row in rows) for column in resumed}
    if any(cells.values()):
        carried["cells"] = {column: count for column, count in cells.items() if count}
    totals = {column: sum(row[column]["status"] == "ok" for row in rows) for column in COLUMNS}
    # configuration types with no model class of their own (a sub-model's config, a processor-only type): nothing to
    # export, so not architectures; their rows stay, counted apart
    configurations = sorted(
        row["model_type"]
        for row in rows
        if any(row[column].get("reason", "").startswith(NO_MODEL_CLASS) for column in SUBJECTS)
    )
    moved = moves(rows, ablations)
    if "ablations" in empty:
        moved["needs"] = dict(sorted({**needs_held, **moved["needs"]}.items()))
    ablation_dates = {
        name: held_ablation(earlier, name, carry is not None) for name in needs_held if "ablations" in empty
    }
    ablation_dates.update({name: {"date": datetime.date.today().isoformat(), "harness": "this"} for name in ablations})
    return {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "date": datetime.date.today().isoformat(),
        "command": COMMAND,
        "total": len(model_types) - len(configurations),
        "configurations": configurations,
        "ok": totals,
        "moves": moved,
        "ablation_dates": dict(sorted(ablation_dates.items())),
        "since": since(baseline, rows),
        "carried": carried if carried["columns"] or carried.get("cells") else None,
        "kept": kept or None,
        "models": rows,
    }


def short(text: str) -> str:
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= REASON_WIDTH else text[: REASON_WIDTH - 1] + "…"


def markdown_cell(entry: dict) -> str:
    if entry.get("carried"):
        return markdown_cell({key: value for key, value in entry.items() if key != "carried"}) + " (carried over)"
    if entry["status"] == "ok":
        return "ok"
    if entry["status"] == "skipped":
        return "–"
    if entry["status"] == "not-run":
        return "not run"
    where = f" `{entry['location']}`" if entry["location"] else ""
    guard = entry.get("guard")
    if guard and guard["line"]:
        line = guard["line"] if len(guard["line"]) <= GUARD_LINE_WIDTH else guard["line"][: GUARD_LINE_WIDTH - 1] + "…"
        line = line.replace("|", "\\|")
        where += f" ({guard['construct']}: `{line}`)"
    elif guard:  # no frame of the model's code was on the stack (torch made fake inputs, say)
        where += f" (guard `{short(guard['guard'])}` added by torch outside the model's code)"
    return f"**{entry['status']}**: {short(entry['reason'])}{where}"


def unswept(data: dict, column: str) -> str:
    """'; N not swept yet' when the column's sweep has not reached N model types (an interrupted sweep), or that the
    column is carried over from an earlier table."""
    carried = data.get("carried")
    if carried and column in carried["columns"]:
        return f"; carried over from the table of {carried['date']}, not re-swept with this harness"
    cells = (carried or {}).get("cells", {}).get(column)
    if cells:
        return f"; {cells} cells carried over from the table of {carried['date']}, not re-swept with this harness yet"
    missing = sum(row[column]["status"] == "not-run" for row in data["models"])
    return f"; {missing} not swept yet" if missing else ""


def markdown(data: dict, model_seconds: dict[str, float]) -> str:
    total = data["total"]
    lines = [
        "# Export coverage",
        "",
        f"transformers {data['transformers']}, torch {data['torch']}, {data['date']}. Produced by `{data['command']}`"
        " (records: `COVERAGE.json`).",
        "",
        "Each model type's tiny seeded model (the class `exportsmith.verify.tasks.model_class` picks) is exported with"
        " dynamic shapes, in each dims style users write (named `Dim`s with min 1, `Dim.DYNAMIC`, `Dim.AUTO`), and run"
        " at shapes other than the traced one (batch 1, 1-token steps on a 1-token cache, long caches, ...); a cell is"
        " `ok` when the programs match eager everywhere, survive `save` and a `load` in a fresh process, and, for an"
        " LM, drive greedy loops that give generate()'s tokens. Columns: the original transformers class with no help,"
        " the original"
        " through `transformers.exporters.DynamoExporter` (its runtime patches), exportsmith's generated copy, and"
        f" the generated copy through `torch.onnx.export(dynamo=True)` run in onnxruntime (max |diff| {ONNX_MAX_ABS_DIFF:g}"
        " to the original's eager output), and its programs lowered to ExecuTorch (XNNPACK) and run in the ExecuTorch"
        f" runtime (max |diff| {EXECUTORCH_MAX_ABS_DIFF:g}; `tools/coverage.py --columns executorch`, with the"
        " `executorch` extra); `–`: not tried, the copy does not verify with torch.export.",
        "",
    ]
    for subject in SUBJECTS:
        ok = data["ok"][subject]
        lines.append(
            f"- **{subject}**: {ok} of {total} architectures export and match eager"
            f" ({100 * ok / total:.1f}%{unswept(data, subject)})"
        )
    ok = data["ok"][ONNX]
    lines.append(
        f"- **{ONNX}**: {ok} of {total} architectures export to ONNX and match eager in onnxruntime"
        f" ({100 * ok / total:.1f}%{unswept(data, ONNX)})"
    )
    ok = data["ok"].get(EXECUTORCH, 0)
    lines.append(
        f"- **{EXECUTORCH}**: {ok} of {total} architectures lower to ExecuTorch and match eager in its runtime"
        f" ({100 * ok / total:.1f}%{unswept(data, EXECUTORCH)})"
    )
    configurations = data.get("configurations") or []
    if configurations:
        lines.append(
            f"- counted apart: {len(configurations)} configuration types with no model class of their own, nothing"
            f" to export (sub-model configurations, processor-only types; `{NO_MODEL_CLASS}...`):"
            f" {', '.join(configurations)}"
        )
    looped = [row for row in data["models"] if row[GREEDY]["status"] != "skipped"]
    lines.append(
        f"- **{GREEDY}**: {data['ok'][GREEDY]} of the {len(looped)} decoder and encoder-decoder LMs whose generated"
        " programs verify give generate()'s tokens in greedy loops driven only by the programs (prompts of 1, 2 and 12"
        " tokens, or an encoder's seeded audio or images, at batch 1 and 2, 16 new tokens; a failure here fails the"
        " generated column too)"
    )
    kept = data.get("kept") or {}
    for date in sorted({entry["date"] for entry in kept.values()}):
        columns = [
            (
                column
                if not entry["cells"] or entry["cells"] == len(data["models"])
                else f"{column} ({entry['cells']} cell{'s' * (entry['cells'] > 1)}, the others re-swept in this run)"
            )
            for column, entry in sorted(kept.items(), key=lambda item: (*COLUMNS, "ablations").index(item[0]))
            if entry["date"] == date
        ]
        lines.append(
            f"- kept from the table of {date}, measured with this harness (their sweep records are not in this run's"
            f" work directory): {', '.join(columns)}"
        )
    moved_since = data.get("since")
    if moved_since:
        lines += ["", f"Since the table of {moved_since['date']} (transformers {moved_since['transformers']}):"]
        for column, moved in moved_since["columns"].items():
            if moved["fail_now"] or moved["pass_now"]:
                lines.append(
                    f"- {column}: {len(moved['fail_now'])} passed there and fail now"
                    + (f" ({', '.join(moved['fail_now'])})" if moved["fail_now"] else "")
                    + f"; {len(moved['pass_now'])} pass now"
                    + (f" ({', '.join(moved['pass_now'])})" if moved["pass_now"] else "")
                )
    moved = data["moves"]
    carried = data.get("carried") or {"columns": []}
    if all(row["original"]["status"] == "not-run" for row in data["models"]):
        lines += ["", "The original was not swept: this table does not say where the generated copy differs from it."]
    else:
        lines += [
            "",
            f"The generated copy passes where the original fails for {len(moved['fixed'])} model types, and fails where the"
            f" original passes for {len(moved['broken'])}"
            + (f" ({', '.join(moved['broken'])})." if moved["broken"] else ".")
            + (
                f" (The original's cells are carried over from {carried['date']}, measured with the earlier harness: a type"
                " listed here may fail the new cases in the original too.)"
                if "original" in carried["columns"]
                else ""
            ),
        ]
    dates = data.get("ablation_dates") or {}
    for codemod, names in moved["needs"].items():
        measured = dates.get(codemod)
        if measured is None:  # a table from before each codemod's ablation had its own date
            note = f", measured with the harness of {carried['date']}" if "ablations" in carried["columns"] else ""
        elif measured["harness"] == "earlier":
            note = f", measured with the harness of {measured['date']}"
        else:
            note = f", measured {measured['date']}" if measured["date"] != data["date"] else ""
        lines.append(
            f"- verify only with the `{codemod}` rewrite ({len(names)}; the generated copy without it fails,"
            f" `python tools/ablation.py {codemod}`{note}): {', '.join(names) or 'none'}"
        )
    spent = ", ".join(
        f"{subject} (kept)" if subject in kept and not value else f"{subject} {value / 3600:.1f} h"
        for subject, value in model_seconds.items()
    )
    lines += ["", f"Time spent in the model processes (the sweep runs two at a time on 2 cores): {spent}."]
    lines += ["", "| model type | class | " + " | ".join(COLUMNS) + " |", "|---|---|" + "---|" * len(COLUMNS)]
    for row in data["models"]:
        cells = " | ".join(markdown_cell(row[column]) for column in COLUMNS)
        lines.append(f"| {row['model_type']} | {row['model_class'] or ''} | {cells} |")
    return "\n".join(lines) + "\n"


def shard(model_types: list[str], spec: str) -> list[str]:
    """The model types of shard `K/N`: every N-th of the sorted types from the K-th (interleaved, so each shard gets
    its share of every family), the same on every machine."""
    try:
        k, n = (int(part) for part in spec.split("/"))
    except ValueError:
        raise ValueError(f"--shard {spec}: expected K/N, e.g. 1/4") from None
    if not 1 <= k <= n:
        raise ValueError(f"--shard {spec}: K must be between 1 and N")
    return sorted(model_types)[k - 1 :: n]


def merge(shards: list[Path], work: Path) -> None:
    """The records of each shard's work directory (`<column>.jsonl`, `without-*.jsonl`), written into `work` as one
    sweep's records, a line per model type in model-type order. A model type recorded by two shards is an error."""
    names = sorted({path.name for directory in shards for path in directory.glob("*.jsonl")})
    if not names:
        raise ValueError(f"no sweep records (*.jsonl) in {', '.join(map(str, shards))}")
    work.mkdir(parents=True, exist_ok=True)
    for name in names:
        merged: dict[str, dict] = {}
        for directory in shards:
            for model_type, line in recorded(directory / name).items():
                if model_type in merged:
                    raise ValueError(
                        f"{model_type} is recorded in {name} of two shards; each shard runs its own types"
                    )
                merged[model_type] = line
        text = "".join(json.dumps(merged[model_type]) + "\n" for model_type in sorted(merged))
        (work / name).write_text(text)


def compare(old: dict, new: dict) -> str:
    """The model types that moved between two COVERAGE.json tables (e.g. two transformers releases), per column."""
    moved = since(old, new["models"])
    before = {row["model_type"] for row in old["models"]}
    after = {row["model_type"] for row in new["models"]}
    lines = [
        f"transformers {old['transformers']} ({old['date']}) -> {new['transformers']} ({new['date']})",
        f"model types: {len(after - before)} new ({', '.join(sorted(after - before)) or 'none'}), "
        f"{len(before - after)} gone ({', '.join(sorted(before - after)) or 'none'})",
    ]
    for column in COLUMNS:
        # a runtime column that was not swept still says "skipped" where the generated copy fails
        if all(row.get(column, {}).get("status", "not-run") in ("not-run", "skipped") for row in new["models"]):
            lines.append(f"{column}: not swept in the new table")
            continue
        ok_old, ok_new = old["ok"].get(column, 0), new["ok"].get(column, 0)
        fail_now, pass_now = moved["columns"][column]["fail_now"], moved["columns"][column]["pass_now"]
        lines.append(
            f"{column}: {ok_old} -> {ok_new} ok; {len(fail_now)} fail now ({', '.join(fail_now) or 'none'}); "
            f"{len(pass_now)} pass now ({', '.join(pass_now) or 'none'})"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=ROOT / "build" / "coverage", help="resumable work directory")
    parser.add_argument("--out", type=Path, default=ROOT / "generated", help="where COVERAGE.md/.json go")
    parser.add_argument("--fresh", action="store_true", help="forget the sweep records of the work directory")
    parser.add_argument("--render-only", action="store_true", help="only rewrite the table from existing records")
    parser.add_argument("--retry", nargs="+", default=[], metavar="STATUS", help="forget records with these statuses")
    parser.add_argument(
        "--models",
        nargs="+",
        default=[],
        metavar="MODEL_TYPE",
        help="sweep only these model types, forgetting their records",
    )
    parser.add_argument(
        "--columns",
        nargs="+",
        default=list(DEFAULT_COLUMNS),
        choices=SWEPT,
        help="the columns to sweep (executorch only when named: it needs the `executorch` extra, in its own"
        " environment)",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        help="an earlier COVERAGE.json (e.g. `git show HEAD:generated/COVERAGE.json`): the table says what moved since;"
        " by default the comparison the current COVERAGE.json holds is kept",
    )
    parser.add_argument(
        "--carry",
        type=Path,
        help="an earlier COVERAGE.json, measured with an earlier harness, whose cells the columns without records"
        " keep, labelled as carried over",
    )
    parser.add_argument(
        "--keep",
        type=Path,
        help="an earlier COVERAGE.json, measured with this harness, whose cells the columns without records keep (its"
        " sweep records are on another machine or gone): e.g. re-sweep one column and keep the others",
    )
    parser.add_argument(
        "--shard",
        metavar="K/N",
        help="sweep only the K-th of N interleaved slices of the model types (one per machine), and write no table:"
        " `--merge` the shards' work directories afterwards",
    )
    parser.add_argument(
        "--merge",
        nargs="+",
        type=Path,
        metavar="SHARD_WORK",
        help="combine the records of these shard work directories into --work, then write the table from them",
    )
    parser.add_argument(
        "--compare",
        nargs=2,
        type=Path,
        metavar=("OLD", "NEW"),
        help="print the model types that moved between two COVERAGE.json tables, and exit",
    )
    parser.add_argument(
        "--carried-only",
        action="store_true",
        help="with --keep: sweep only the model types whose cells of --columns that table carried over from an"
        " earlier harness (an interrupted re-sweep goes on where it stopped)",
    )
    parser.add_argument("--jobs", type=int, default=JOBS)
    parser.add_argument("--timeout", type=float, default=TIMEOUT, help="seconds per model type and subject")
    args = parser.parse_args(argv)
    if args.carry and args.keep:
        parser.error("--carry and --keep: give one earlier table (--carry if the harness changed since, else --keep)")

    if args.compare:
        old, new = (json.loads(path.read_text()) for path in args.compare)
        sys.stdout.write(compare(old, new))
        return 0
    model_types = sorted(CONFIG_MAPPING_NAMES)
    unknown = sorted(set(args.models) - set(model_types))
    if unknown:
        parser.error(f"not model types of transformers {transformers.__version__}: {', '.join(unknown)}")
    package = args.work / "generated"
    args.work.mkdir(parents=True, exist_ok=True)
    if args.merge:
        try:
            merge(args.merge, args.work)
        except ValueError as error:
            parser.error(str(error))
    swept_types = args.models or model_types
    if args.carried_only:
        if not args.keep:
            parser.error("--carried-only reads the carried cells of the table given with --keep")
        kept_table = json.loads(args.keep.read_text())
        wholly = (kept_table.get("carried") or {}).get("columns", [])
        swept_types = [
            row["model_type"]
            for row in kept_table["models"]
            if row["model_type"] in swept_types
            and any("carried" in row[column] or column in wholly for column in args.columns)
        ]
    if args.shard:
        try:
            swept_types = shard(swept_types, args.shard)
        except ValueError as error:
            parser.error(str(error))
    if not (args.render_only or args.merge):
        for column in args.columns:
            work = args.work / f"{column}.jsonl"
            if args.fresh:
                work.unlink(missing_ok=True)
            elif args.retry or args.models:
                forget_once(work, args.retry, args.models)
        if {"generated", *RUNTIMES} & set(args.columns):
            generate_all(package)
        earlier = json.loads((args.carry or args.keep).read_text()) if args.carry or args.keep else None
        for column in args.columns:
            sweep_column(column, swept_types, args.work, package, args.jobs, args.timeout, earlier)
            recheck_note(args.work / f"{column}.jsonl").unlink(missing_ok=True)  # the re-check is complete
        if args.shard:
            print(f"shard {args.shard}: records in {args.work}; merge the shards with --merge", file=sys.stderr)
            return 0
    records = {column: recorded(args.work / f"{column}.jsonl") for column in SWEPT}
    ablations = {
        path.stem.removeprefix("without-"): recorded(path) for path in sorted(args.work.glob("without-*.jsonl"))
    }
    baseline = json.loads(args.baseline.read_text()) if args.baseline else None
    carry = json.loads(args.carry.read_text()) if args.carry else None
    keep = json.loads(args.keep.read_text()) if args.keep else None
    data = table(records, model_types, ablations, baseline, carry, keep)
    current = args.out / "COVERAGE.json"
    if baseline is None and current.exists():  # keep the comparison an earlier render made
        data["since"] = json.loads(current.read_text()).get("since")
    model_seconds = {c: sum(r.get("seconds", 0.0) for r in records[c].values()) for c in SWEPT}
    (args.out / "COVERAGE.json").write_text(json.dumps(data, indent=1) + "\n")
    (args.out / "COVERAGE.md").write_text(markdown(data, model_seconds))
    print(", ".join(f"{c}: {data['ok'][c]} of {data['total']}" for c in COLUMNS), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
