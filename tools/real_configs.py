"""The real-configuration set: popular checkpoints' configs, layers reduced, through the whole of `verify`.

    python tools/real_configs.py                      # every config of exportsmith/verify/real_configs/ but
                                                      # those OVER_BUDGET (named with --names, they run)
    python tools/real_configs.py --names openai-community--gpt2 --fresh

Each config runs in its own child process (address-space cap, timeout; one at a time by default, real widths need
the memory): `exportsmith.verify.isolate.check_real`, i.e. the generated copy of the installed transformers'
model at that config with random seeded weights, its decode and prefill programs (named dims) at every harness case
plus the cases that cross its sliding window, saved and loaded in a fresh process, and the greedy loops against
`generate()`. Records go to `build/real_configs/records.jsonl` as they come (an interrupted run resumes), then
`generated/REAL_CONFIGS.md`: one row per checkpoint with its verdict, its worst max |diff|, its greedy loops, its
window, its peak memory, its time, and this command. Peak memory is the child's maximum resident set.
"""

import argparse
import datetime
import json
import subprocess
import sys
from functools import partial
from pathlib import Path

import torch
import transformers

from exportsmith.verify.isolate import check_real, recorded, sweep
from exportsmith.verify.real import real_config, real_config_names, sliding_window

ROOT = Path(__file__).resolve().parents[1]
COMMAND = "python tools/real_configs.py"
MEMORY_LIMIT = 24 * 2**30  # address space; torch reserves far more than it touches, the peak RSS is what counts
MEMORY_BUDGET = 8 * 2**30  # resident memory a model may use
TIMEOUT = 3600.0
# Checkpoints whose one layer does not fit the budget: run only when named (`--names`), where memory allows
OVER_BUDGET = {
    "mistralai--Mixtral-8x7B-v0.1": "one float32 layer is 6.9 GB of weights, and saving the program copies each "
    "tensor's bytes (its fused expert weights are 3.8 GB): 14.5 GB peak measured, over the 8 GB budget",
}


def generate(package: Path, model_types: list[str]) -> None:
    command = [sys.executable, "-m", "exportsmith", "generate", *sorted(set(model_types)), "--out", str(package)]
    subprocess.run(command, check=True)


def within_budget(names: list[str]) -> list[str]:
    """The checkpoints a run without `--names` runs: all but those OVER_BUDGET."""
    return [name for name in names if name not in OVER_BUDGET]


def markdown(records: dict[str, dict], names: list[str]) -> str:
    lines = [
        "# Real configurations",
        "",
        f"transformers {transformers.__version__}, torch {torch.__version__}, {datetime.date.today().isoformat()}. "
        f"Produced by `{COMMAND}`.",
        "",
        "The configuration of each checkpoint below is written out in `src/exportsmith/verify/real_configs/` (no hub "
        "access): every field as released, the layer count reduced. Its generated copy, with random seeded weights, "
        "is verified as `exportsmith verify --config NAME` does: eager identity with transformers' class, decode and "
        "prefill programs (named dims, min 1) at every harness case (batch 1 and 4, 1-token steps on a 1-token "
        "cache, ...) and, where attention slides, a chunk that straddles the window, a step on a cache longer than "
        "it and a prefill longer than it; save and load in a fresh process; greedy loops driven only by the programs "
        "(prompts of 1, 2 and 12 tokens, batch 1 and 2, 16 new tokens) against `generate(do_sample=False)`. "
        "A program matches eager within rounding relative to the outputs' magnitude (1e-5 + 1.3e-6 x the largest "
        "|eager value| of the case: `exportsmith/verify/tolerance.py`). "
        f"Each runs alone in a child process; memory budget {MEMORY_BUDGET / 2**30:.0f} GB resident.",
        "",
        "| checkpoint | model type | layers | window | verdict | max \\|diff\\| | greedy loops | peak memory | time |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in names:
        record = records.get(name)
        if record is None:
            why = f": {OVER_BUDGET[name]}" if name in OVER_BUDGET else ""
            lines.append(f"| {name} | | | | not run{why} | | | | |")
            continue
        details = record.get("details", {})
        diffs = [case["max_diff"] for case in details.get("cases", []) if case.get("max_diff") is not None]
        greedy = details.get("greedy", [])
        same = sum(loop["match"] for loop in greedy)
        ties = sum(loop["tie"] and not loop["match"] for loop in greedy)
        loops = f"{same} of {len(greedy)} same" + (f", {ties} tie(s)" if ties else "") if greedy else "–"
        peak = details.get("peak_rss")
        over = peak is not None and peak > MEMORY_BUDGET
        memory = f"{peak / 2**30:.1f} GB" + (" **over budget**" if over else "") if peak else "–"
        verdict = "ok" if record["status"] == "ok" else f"**{record['status']}**: {record['reason'][:200]}"
        config = real_config(name)
        window = sliding_window(config) or "–"
        diff = f"{max(diffs):.3g}" if diffs else "–"
        lines.append(
            f"| {name} | {config.model_type} | {config.num_hidden_layers} | {window} | {verdict} | {diff} | {loops} | "
            f"{memory} | {record['seconds']:.0f} s |"
        )
    passed = sum(records.get(name, {}).get("status") == "ok" for name in names)
    lines += ["", f"**{passed} of {len(names)}** checkpoints pass.", ""]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--names", nargs="+", help="checkpoints to run (default: all)")
    parser.add_argument("--fresh", action="store_true", help="forget the records of earlier runs")
    parser.add_argument("--work", type=Path, default=ROOT / "build" / "real_configs")
    parser.add_argument("--out", type=Path, default=ROOT / "generated" / "REAL_CONFIGS.md")
    parser.add_argument("--jobs", type=int, default=1)
    args = parser.parse_args()
    names = real_config_names()
    selected = args.names or within_budget(names)
    unknown = sorted(set(selected) - set(names))
    if unknown:
        print(f"error: unknown real config(s) {', '.join(unknown)}; one of: {', '.join(names)}", file=sys.stderr)
        return 2
    args.work.mkdir(parents=True, exist_ok=True)
    path = args.work / "records.jsonl"
    if args.fresh:
        path.unlink(missing_ok=True)
    elif args.names:  # run the named ones again
        kept = {name: record for name, record in recorded(path).items() if name not in selected}
        path.write_text("".join(json.dumps(record) + "\n" for record in kept.values()))
    package = args.work / "generated"
    generate(package, [real_config(name).model_type for name in names])
    check = partial(check_real, package=package.name, path=str(package.parent))
    records = sweep(selected, path, check, jobs=args.jobs, timeout=TIMEOUT, memory_limit=MEMORY_LIMIT)
    args.out.write_text(markdown(records, names))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0 if all(records.get(name, {}).get("status") == "ok" for name in selected) else 1


if __name__ == "__main__":
    sys.exit(main())
