"""Eager cost of a `cond-branches` rewrite (not a test): the original function against its rewrite, where eager
runs the plain `if` over the branch functions. The issue asks for at most 2%.

    python tools/bench_cond_eager.py [--repeat 7] [--number 2000] [--json]

Measures the fixture functions of `tests/fixtures/cond_branches/select_shapes.in.py` and the fp16 clamp layer of
`select_fp16_clamp.in.py`, on a tiny input (the per-call Python overhead at its most visible) and on a
decoder-sized one (batch 2, 128 tokens, hidden 512). Interleaves original and rewritten runs and reports the best of the repeats (the least disturbed by other load).
"""

from __future__ import annotations

import argparse
import json
import sys
import timeit
import types
from pathlib import Path

import torch

from codemods.cond_branches import CondBranches
from exportsmith.pipeline import run_codemods

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "cond_branches"


def _pair(case: str) -> tuple[types.ModuleType, types.ModuleType]:
    source = (FIXTURES / f"{case}.in.py").read_text()
    rewritten = run_codemods(source, case, "transformers.models.toy.modeling_toy", (CondBranches,)).rewritten
    modules = []
    for name, text in ((f"{case}_original", source), (f"{case}_rewritten", rewritten)):
        module = types.ModuleType(name)
        exec(compile(text, name, "exec"), module.__dict__)
        modules.append(module)
    return modules[0], modules[1]


def _cases(size: tuple[int, ...]):
    original, rewritten = _pair("select_shapes")
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(*size, generator=generator)
    gate = torch.randn(*size, generator=generator)
    mask = x > 0
    yield "several_results (if/else)", original.several_results, rewritten.several_results, (x, gate, 1.5)
    yield "elif_chain", original.elif_chain, rewritten.elif_chain, (x, 0.5)
    yield "both_arms_return", original.both_arms_return, rewritten.both_arms_return, (x, mask)
    yield "nested_ifs", original.nested_ifs, rewritten.nested_ifs, (x, True, 0.25)
    original, rewritten = _pair("select_fp16_clamp")
    layers = []
    for module in (original, rewritten):
        torch.manual_seed(0)
        layers.append(module.ToyEncoderLayer(size[-1]).eval())
    yield "fp16 clamp layer (one arm)", layers[0], layers[1], (x,)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--number", type=int, default=2000)
    parser.add_argument("--json", action="store_true", help="print one JSON list of rows (for tools/bench.py)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    if not args.json:
        print(f"torch {torch.__version__}, best of {args.repeat} x {args.number} calls, microseconds per call")
    with torch.inference_mode():
        for size in ((2, 8), (2, 128, 512)):
            number = args.number if size == (2, 8) else max(args.number // 20, 20)
            if not args.json:
                print(f"input {size}:")
            for label, before, after, call_args in _cases(size):
                times = {"original": [], "rewritten": []}
                for _ in range(args.repeat):
                    for name, function in (("original", before), ("rewritten", after)):
                        seconds = timeit.timeit(lambda: function(*call_args), number=number)
                        times[name].append(seconds / number * 1e6)
                original, rewritten = (min(times[k]) for k in ("original", "rewritten"))
                rows.append({"case": label, "size": list(size), "original": original, "rewritten": rewritten})
                if not args.json:
                    print(f"  {label:30s} {original:9.2f} {rewritten:9.2f}  {100 * (rewritten / original - 1):+6.2f}%")
    if args.json:
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
