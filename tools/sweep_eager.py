"""Build the tiny model of every model type of the installed transformers and run one eager forward, each isolated.

    python tools/sweep_eager.py                  # all model types; resumes from the work file
    python tools/sweep_eager.py --fresh          # start over
    python tools/sweep_eager.py llama whisper    # only these (prints their records, leaves EAGER.json alone)

Each model type runs in its own child process (memory cap, timeout: see exportsmith.verify.isolate), two at a
time. Records go to the work file as they come (JSON lines with timings, not committed); when every model type is
recorded, `generated/EAGER.json` is rewritten: sorted, one record per model type, no timings, so that the same
transformers gives the same file. Prints "N of M model types build and run eager (P%)".
"""

import argparse
import json
import sys
from pathlib import Path

import torch
import transformers
from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

from exportsmith.verify.isolate import JOBS, MEMORY_LIMIT, TIMEOUT, sweep

ROOT = Path(__file__).resolve().parents[1]
COMMITTED_FIELDS = ("model_type", "status", "reason", "params", "model_class")


def committed(records: dict[str, dict]) -> dict:
    ok = sum(record["status"] == "ok" for record in records.values())
    return {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "ok": ok,
        "total": len(records),
        "models": [{field: records[name].get(field) for field in COMMITTED_FIELDS} for name in sorted(records)],
    }


def summary_line(records: dict[str, dict]) -> str:
    ok = sum(record["status"] == "ok" for record in records.values())
    return f"{ok} of {len(records)} model types build and run eager ({100 * ok / len(records):.1f}%)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_types", nargs="*", help="only these model types (default: all)")
    parser.add_argument("--work", type=Path, default=ROOT / "build" / "eager-sweep.jsonl", help="resumable work file")
    parser.add_argument("--out", type=Path, default=ROOT / "generated" / "EAGER.json")
    parser.add_argument("--fresh", action="store_true", help="forget the records of the work file")
    parser.add_argument("--jobs", type=int, default=JOBS)
    parser.add_argument("--timeout", type=float, default=TIMEOUT, help="seconds per model type")
    parser.add_argument("--memory-gb", type=float, default=MEMORY_LIMIT / 2**30, help="address space per child")
    args = parser.parse_args()

    unknown = sorted(set(args.model_types) - set(CONFIG_MAPPING_NAMES))
    if unknown:
        parser.error(f"unknown model types: {', '.join(unknown)}")
    everything = not args.model_types
    model_types = sorted(CONFIG_MAPPING_NAMES) if everything else args.model_types
    work = args.work if everything else args.work.with_suffix(".only.jsonl")
    work.parent.mkdir(parents=True, exist_ok=True)
    if args.fresh or not everything:
        work.unlink(missing_ok=True)
    records = sweep(model_types, work, jobs=args.jobs, timeout=args.timeout, memory_limit=int(args.memory_gb * 2**30))
    records = {name: records[name] for name in model_types}
    if everything:
        args.out.write_text(json.dumps(committed(records), indent=1) + "\n")
    else:
        for name in model_types:
            print(json.dumps(records[name]))
    print(summary_line(records), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
