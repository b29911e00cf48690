"""Deployed decode-step latency (a benchmark, not a test): the generated copy's decode program in ONNX Runtime and in
ExecuTorch (XNNPACK), against what transformers' own exporters (`OnnxExporter`, `ExecutorchExporter`) make of the
original model; the same real configuration and weights, the same inputs, one decode step.

    .venv-executorch/bin/python tools/bench_runtimes.py    # needs the executorch and onnx extras
    python tools/bench_runtimes.py --config Qwen--Qwen3-0.6B --layers 2 --past 64 --repeats 20

Each program is called the way a deployment loop calls it (keyword inputs with the cache in, the model output with
its cache out: `OrtProgram` / `EtProgram` for exportsmith's, transformers' `ExportedModel` for theirs), `--warmup`
times, then timed `--repeats` times; the median is reported. Each program's logits at that step are compared with the
original's eager logits first, so a fast wrong program is reported as such. Ratios are exportsmith / transformers:
below 1 is faster. Writes the "Deployed decode step" section of BENCHMARKS.md (`tools/bench.py` keeps it).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the committed generated/ package
import generated  # noqa: E402, F401  (first: registers the cache pytree nodes)
from exportsmith.verify.check import build_pair, export_program, programs_for, run, varying_dims  # noqa: E402
from exportsmith.verify.inputs import Case  # noqa: E402
from exportsmith.verify.real import real_config  # noqa: E402

SECTION = "## Deployed decode step"


def median_ms(call, inputs: dict, warmup: int, repeats: int) -> float:
    for _ in range(warmup):
        call(**inputs())
    times = []
    for _ in range(repeats):
        fresh = inputs()
        started = time.perf_counter()
        call(**fresh)
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def logits_diff(call, inputs: dict, expected: torch.Tensor) -> float:
    return (call(**inputs()).logits - expected).abs().max().item()


def ours_onnx(copy, program):
    from exportsmith.verify.onnx_check import OrtProgram, export_onnx, name_graph_io, ort_session

    example = program.cases[0]
    onnx_program = export_onnx(copy, example.inputs(), varying_dims(program))
    name_graph_io(onnx_program, copy, example)
    return OrtProgram(ort_session(onnx_program), onnx_program, run(copy, example))


def ours_executorch(copy, program):
    from exportsmith.verify.executorch_check import EtProgram, bounded_dims
    from exportsmith.verify.executorch_recipe import prepare_for_xnnpack

    prepare_for_xnnpack(copy)  # as `verify --executorch` sets the copy up
    return EtProgram(export_program(copy, program.cases[0].inputs(), bounded_dims(program)))


def theirs(kind: str, original, program):
    from transformers.exporters import ExecutorchConfig, ExecutorchExporter, OnnxConfig, OnnxExporter

    exporter, config = (
        (OnnxExporter(), OnnxConfig(dynamic=True))
        if kind == "onnx"
        else (
            ExecutorchExporter(),
            ExecutorchConfig(backend="xnnpack", dynamic=True),
        )
    )
    return exporter.export(original, program.cases[0].inputs(), config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="HuggingFaceTB--SmolLM2-360M", help="a real configuration the repo holds")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--past", type=int, default=100, help="cached positions at the timed step (past + 1 <= BOUND)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--out", type=Path, default=ROOT / "BENCHMARKS.md")
    args = parser.parse_args()

    torch.manual_seed(0)
    config = real_config(args.config, args.layers)
    original, generated_model = build_pair(config.model_type, "generated", config)
    for model in (original, generated_model):  # both for inference, as transformers' ExecutorchExporter does
        model.requires_grad_(False)
    step = Case("bench-step", batch=1, new_tokens=1, past=args.past)
    decode = programs_for(original, cache_model=generated_model, extra=((step,), ()))[0]
    bench_case = decode.cases[-1]
    expected = run(original, bench_case).logits

    rows = []
    for runtime, build_ours in (("ONNX Runtime", ours_onnx), ("ExecuTorch (XNNPACK)", ours_executorch)):
        kind = "onnx" if runtime.startswith("ONNX") else "executorch"
        timings = {}
        for who, build in (("exportsmith", lambda: build_ours(generated_model, decode)), ("transformers", None)):
            try:
                call = build() if build else theirs(kind, original, decode)
                diff = logits_diff(call, bench_case.inputs, expected)
                timings[who] = (median_ms(call, bench_case.inputs, args.warmup, args.repeats), diff, "")
            except Exception as error:  # a benchmark reports what failed and goes on
                timings[who] = (None, None, f"{type(error).__name__}: {str(error).splitlines()[0][:120]}")
            print(runtime, who, timings[who], flush=True)
        rows.append((runtime, timings))

    lines = [
        SECTION,
        "",
        f"`tools/bench_runtimes.py --config {args.config} --layers {args.layers} --past {args.past}`: the decode program "
        f"of the {config.model_type} real configuration ({args.layers} layers, random weights), one step at batch 1, "
        f"1 new token, {args.past} cached positions; median of {args.repeats} calls after {args.warmup}, as a "
        "deployment loop calls the program (cache in, model output with its cache out). exportsmith: the generated "
        "copy through `torch.onnx.export(dynamo=True)` / `to_edge_transform_and_lower(XnnpackPartitioner)` as "
        "`verify --onnx` / `--executorch` export it; transformers: its `OnnxExporter` / `ExecutorchExporter` "
        "(`dynamic=True`, backend xnnpack) on the original model. max|diff|: the step's logits against the "
        "original's eager logits. "
        + ", ".join(f"{name} {importlib.metadata.version(name)}" for name in ("torch", "onnxruntime", "executorch"))
        + ".",
        "",
        "| runtime | exportsmith ms | transformers ms | ratio | max\\|diff\\| exportsmith / transformers |",
        "|---|---|---|---|---|",
    ]
    for runtime, timings in rows:
        (ours_ms, ours_diff, ours_error), (their_ms, their_diff, their_error) = (
            timings["exportsmith"],
            timings["transformers"],
        )
        ratio = f"**{ours_ms / their_ms:.2f}**" if ours_ms and their_ms else "–"
        lines.append(
            f"| {runtime} | {f'{ours_ms:.2f}' if ours_ms else ours_error} | "
            f"{f'{their_ms:.2f}' if their_ms else their_error} | {ratio} | "
            f"{ours_diff if ours_diff is None else f'{ours_diff:.2g}'} / "
            f"{their_diff if their_diff is None else f'{their_diff:.2g}'} |"
        )
    write_section(args.out, "\n".join(lines) + "\n")


def write_section(path: Path, section: str) -> None:
    """Replace (or append) this tool's section of BENCHMARKS.md, leaving the rest as `tools/bench.py` wrote it."""
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    start = text.find(SECTION)
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        end = text.find("\n## ", start + len(SECTION))
        text = text[:start] + section + (text[end + 1 :] if end >= 0 else "")
    path.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
