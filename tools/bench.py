"""Benchmarks (not tests): generation speed against the libcst floor, no-op regeneration, eager and export overhead.

    python tools/bench.py                 # everything, writes BENCHMARKS.md
    python tools/bench.py --skip-generation

Every timing runs in a fresh subprocess so that imports, pytree registrations and caches of one measurement cannot
leak into another. Ratios are (exportsmith) / (reference): below 1 is faster. The models measured for eager and
export time are generated from the installed transformers into a scratch package first, so the numbers never come
from a stale `generated/`. The whole of BENCHMARKS.md is written here: the cost of one `cond-branches` rewrite comes
from `tools/bench_cond_eager.py --json`, and the per-phase split of generation from `tools/profile_generate.py`.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXPORTSMITH = [sys.executable, "-m", "exportsmith"]
# deepseek_v4 carries a `cond-branches` rewrite on its hot path (the attention mask of every layer), so its eager
# overhead is the cost of a rewritten `if` in a real decoder.
EAGER_MODELS = ("llama", "mixtral", "deepseek_v4")
EXPORT_MODELS = ("llama", "mixtral")
EAGER_INSTANCES = 3

# Runs in a child: parse and print every file that generation reads (shared, modeling and modular files), in `jobs` processes, like generation does.
FLOOR = """
import sys, time, multiprocessing
import libcst
from exportsmith.discover import find_transformers
tf = find_transformers()
paths = list(tf.shared_modules) + [p for model in tf.models.values() for p in model.modeling + model.modular]
def parse_and_print(path):
    return len(libcst.parse_module(path.read_text(encoding="utf-8")).code)
if sys.argv[2] == "paused":  # the cyclic collector paused in the workers, as generation pauses it
    import gc
    gc.disable()
started = time.perf_counter()
with multiprocessing.get_context("fork").Pool(int(sys.argv[1])) as pool:
    pool.map(parse_and_print, paths, chunksize=1)
print(time.perf_counter() - started, len(paths))
"""

# Runs in a child: median eager forward times, interleaved in rotating order. Two instances of one class with the
# same weights already differ by a percent or two (allocation order, memory placement), so each variant is built
# several times, and the spread between the original's own instances is the noise floor.
EAGER = """
import json, statistics, sys
import time
sys.path.insert(0, sys.argv[3])
import torch
import generated
from exportsmith.verify.check import build_pair
from exportsmith.verify.inputs import Case, case_inputs
torch.set_num_threads(1)
reference, copy = build_pair(sys.argv[1], "generated")
def twin(cls):
    model = cls(reference.config).eval()
    model.load_state_dict(reference.state_dict())
    return model
instances = int(sys.argv[4])
models = [(variant, twin(cls)) for _ in range(instances) for variant, cls in
          (("original", type(reference)), ("generated", type(copy)))]
results = {}
for name, case in (("decode", Case("decode", 1, 1, 32)), ("prefill", Case("prefill", 1, 64, 0))):
    times = [[] for _ in models]
    for repeat in range(int(sys.argv[2])):
        shift = repeat % len(models)
        for index in list(range(len(models)))[shift:] + list(range(len(models)))[:shift]:
            inputs = case_inputs(reference, reference.config.vocab_size, case)
            with torch.no_grad():
                started = time.perf_counter()
                models[index][1](**inputs)
                times[index].append(time.perf_counter() - started)
    medians = {"original": [], "generated": []}
    for (variant, _), values in zip(models, times):
        medians[variant].append(statistics.median(values[10:]))
    results[name] = medians
print(json.dumps(results))
"""

# Runs in a child: median export time of one variant, after one warm-up export.
EXPORT = """
import json, statistics, sys, time
import torch
from exportsmith.verify.inputs import DECODE_EXAMPLE, case_inputs
variant, model_type, repeats = sys.argv[1], sys.argv[2], int(sys.argv[3])
auto = torch.export.Dim.AUTO
if variant == "generated":
    sys.path.insert(0, sys.argv[4])
    import generated
    from exportsmith.verify.check import build_pair
    from exportsmith.verify.shapes import dynamic_shapes_like
    reference, model = build_pair(model_type, "generated")
    def export(inputs):
        shapes = {name: dynamic_shapes_like(value, lambda t: {d: auto for d in range(t.dim())})
                  if name != "use_cache" else None for name, value in inputs.items()}
        return torch.export.export(model, (), inputs, dynamic_shapes=shapes, strict=False)
else:
    import importlib
    from transformers.exporters.exporter_dynamo import DynamoConfig, DynamoExporter
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    from transformers.models.auto.configuration_auto import model_type_to_module_name
    from exportsmith.verify.tiny import tiny_config
    module = model_type_to_module_name(model_type)
    cls = getattr(importlib.import_module(f"transformers.models.{module}.modeling_{module}"),
                  MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])
    torch.manual_seed(0)
    reference = model = cls(tiny_config(model_type)).eval()
    def export(inputs):
        return DynamoExporter().export(model, inputs, DynamoConfig(dynamic=True))
times = []
for repeat in range(repeats + 1):
    inputs = case_inputs(reference, reference.config.vocab_size, DECODE_EXAMPLE)
    started = time.perf_counter()
    export(inputs)
    times.append(time.perf_counter() - started)
print(json.dumps(statistics.median(times[1:])))
"""


def run_python(*args: str) -> str:
    """The stdout of `python ARGS` run from the project root; its stderr tail when it fails."""
    result = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"benchmark child {args[0]} failed:\n{result.stderr[-3000:]}")
    return result.stdout.strip()


def run_child(code: str, *args: str) -> str:
    return run_python("-c", code, *args).splitlines()[-1]


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(command: list[str], env: dict | None = None) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system of the command and every process it waited for)."""
    started, cpu = time.perf_counter(), children_cpu()
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")
    return time.perf_counter() - started, children_cpu() - cpu


def bench_generation(jobs: int) -> dict:
    with tempfile.TemporaryDirectory() as scratch:
        env = {**os.environ, "EXPORTSMITH_CACHE_DIR": str(Path(scratch) / "cache")}
        out = str(Path(scratch) / "generated")
        floor_cpu = children_cpu()
        floor, files = run_child(FLOOR, str(jobs), "collected").split()
        floor_cpu = children_cpu() - floor_cpu
        paused_cpu = children_cpu()
        paused, _ = run_child(FLOOR, str(jobs), "paused").split()
        paused_cpu = children_cpu() - paused_cpu
        full, full_cpu = timed([*EXPORTSMITH, "generate", "--all", "--out", out, "--jobs", str(jobs), "--no-cache"], env)
        timed([*EXPORTSMITH, "generate", "--all", "--out", out, "--jobs", str(jobs)], env)  # fills the cache
        noop, _ = timed([*EXPORTSMITH, "generate", "--all", "--out", out, "--jobs", str(jobs)], env)
        check, _ = timed([*EXPORTSMITH, "check", out, "--jobs", str(jobs)], env)
    return {
        "files": int(files), "floor": float(floor), "floor_cpu": floor_cpu, "full": full, "full_cpu": full_cpu,
        "paused": float(paused), "paused_cpu": paused_cpu,
        "noop": noop, "check": check, "jobs": jobs,
    }


def bench_profile(every: int) -> str:
    """The per-phase CPU table of tools/profile_generate.py over every `every`th model."""
    return run_python(str(ROOT / "tools" / "profile_generate.py"), "--every", str(every))


def bench_cond_eager() -> list[dict]:
    return json.loads(run_python(str(ROOT / "tools" / "bench_cond_eager.py"), "--json"))


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} cores ({cpu}), {memory:.0f} GiB RAM, {platform.system()} {platform.machine()}"


def versions() -> str:
    import torch
    import transformers

    return (
        f"Python {platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__}, "
        f"libcst {importlib.metadata.version('libcst')}"
    )


def report(generation: dict | None, profile: str | None, eager: dict, cond: list[dict], export: dict) -> str:
    lines = [
        "# Benchmarks\n",
        "Produced by `python tools/bench.py` (a benchmark, not a test); numbers are from one run on the machine "
        "below and move by a few percent between runs.\n",
        f"- Machine: {machine()}",
        f"- Versions: {versions()}\n",
    ]
    if generation is not None:
        g = generation
        lines += [
            "## Generation\n",
            "Wall seconds, and CPU seconds (user + system of every process) which a busy machine moves less. "
            "Generation pauses Python's cyclic garbage collector while it renders (parsed trees hold no cycles, and "
            "rescanning them in full collections made parsing cost ~40% more); the floor is given both as a plain "
            "script runs it and with the collector paused the same way, the fair comparison for the work itself.\n",
            "| what | wall s | CPU s | target |",
            "|---|---|---|---|",
            f"| bare libcst parse + print of the {g['files']} input files, {g['jobs']} processes (floor) | "
            f"{g['floor']:.1f} | {g['floor_cpu']:.1f} | |",
            f"| the same floor with the cyclic GC paused in the workers, as generation pauses it | {g['paused']:.1f} | "
            f"{g['paused_cpu']:.1f} | |",
            f"| `exportsmith generate --all --no-cache --jobs {g['jobs']}` | {g['full']:.1f} | {g['full_cpu']:.1f} | |",
            f"| ratio full / floor | **{g['full'] / g['floor']:.2f}** | **{g['full_cpu'] / g['floor_cpu']:.2f}** | <= 1.3 |",
            f"| ratio full / floor with the GC paused | {g['full'] / g['paused']:.2f} | "
            f"{g['full_cpu'] / g['paused_cpu']:.2f} | |",
            f"| no-op regeneration (`generate --all`, cache warm, output up to date) | **{g['noop']:.2f}** | | <= 3 |",
            f"| `exportsmith check` of the full tree, cache warm | {g['check']:.2f} | | |",
            "",
        ]
    if profile is not None:
        lines += [
            "### Where generation spends its time\n",
            "`python tools/profile_generate.py --every 8`: one process, cache off, exclusive CPU seconds per phase "
            "over every 8th model module and the shared modules.\n",
            profile,
            "",
        ]
    lines += [
        "## Eager overhead of the generated copy\n",
        "One thread, tiny seeded models (Python overhead dominates, which is where a gated `torch.cond` would show). "
        f"{EAGER_INSTANCES} original and {EAGER_INSTANCES} generated instances, built the same way from the same "
        "weights, are called in rotating order; each instance's median call time is taken, and each variant's time "
        "is the median over its instances. Instances of one class differ by themselves (allocation order, memory "
        "placement): the noise floor is the largest over the smallest median among the original's own instances. "
        "Decode: batch 1, 1 new token, past 32. Prefill: batch 1, 64 tokens. deepseek_v4 carries a `cond-branches` "
        "rewrite in the attention of every layer.\n",
        "| model | step | original ms | generated ms | ratio (target <= 1.02) | noise floor: spread of the originals |",
        "|---|---|---|---|---|---|",
    ]
    for model, steps in eager.items():
        for step, t in steps.items():
            original, generated = statistics.median(t["original"]), statistics.median(t["generated"])
            noise = max(t["original"]) / min(t["original"])
            lines.append(
                f"| {model} | {step} | {original * 1e3:.3f} | {generated * 1e3:.3f} | {generated / original:.3f} | "
                f"{noise:.3f} |"
            )
    lines += [
        "\n## Eager cost of one `cond-branches` rewrite\n",
        "`python tools/bench_cond_eager.py`: the fixture functions against their rewrites, whose eager path is the "
        "plain `if` over local `true_fn`/`false_fn`; best of the repeats, microseconds per call, on a tiny input "
        "(the fixed cost at its most visible) and a decoder-sized one (batch 2, 128 tokens, hidden 512).\n",
        "| rewrite shape | input | original µs | rewritten µs | change |",
        "|---|---|---|---|---|",
    ]
    for row in cond:
        change = 100 * (row["rewritten"] / row["original"] - 1)
        lines.append(
            f"| {row['case']} | {tuple(row['size'])} | {row['original']:.2f} | {row['rewritten']:.2f} | {change:+.1f}% |"
        )
    lines += [
        "\n## Export time\n",
        "Median of 3 decode exports after one warm-up, every tensor dim `Dim.AUTO` on both sides (what "
        "`DynamoConfig(dynamic=True)` does). Original: transformers' `DynamoExporter` with its runtime patches. "
        "Generated: plain `torch.export.export(strict=False)`.\n",
        "| model | DynamoExporter on the original, s | torch.export on the generated copy, s | ratio (target <= 1.0) |",
        "|---|---|---|---|",
    ]
    for model, times in export.items():
        ratio = times["generated"] / times["dynamo"]
        lines.append(f"| {model} | {times['dynamo']:.2f} | {times['generated']:.2f} | {ratio:.2f} |")
    return "\n".join(lines) + "\n"


# Sections other tools write into BENCHMARKS.md (they need another environment): kept as they are
KEPT_SECTIONS = ("## Deployed decode step",)  # tools/bench_runtimes.py, with the executorch extra


def kept_sections(path: Path) -> str:
    """The KEPT_SECTIONS of the current BENCHMARKS.md, each up to the next section, to append to the new report."""
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    kept = []
    for header in KEPT_SECTIONS:
        start = text.find(header)
        if start >= 0:
            end = text.find("\n## ", start + len(header))
            kept.append(text[start : end + 1 if end >= 0 else len(text)])
    return "".join("\n" + section for section in kept)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-generation", action="store_true")
    parser.add_argument("--skip-profile", action="store_true")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--repeats", type=int, default=200, help="eager calls per model and step")
    parser.add_argument("--out", type=Path, default=ROOT / "BENCHMARKS.md")
    args = parser.parse_args()
    generation = None if args.skip_generation else bench_generation(args.jobs)
    profile = None if args.skip_profile else bench_profile(8)
    with tempfile.TemporaryDirectory() as scratch:
        models = sorted(set(EAGER_MODELS) | set(EXPORT_MODELS))
        timed([*EXPORTSMITH, "generate", *models, "--out", str(Path(scratch) / "generated")])
        eager = {
            model: json.loads(run_child(EAGER, model, str(args.repeats), scratch, str(EAGER_INSTANCES)))
            for model in EAGER_MODELS
        }
        export = {
            model: {
                variant: json.loads(run_child(EXPORT, variant, model, "3", scratch)) for variant in ("dynamo", "generated")
            }
            for model in EXPORT_MODELS
        }
    text = report(generation, profile, eager, bench_cond_eager(), export) + kept_sections(args.out)
    args.out.write_text(text)
    sys.stdout.write(text)


if __name__ == "__main__":
    main()
