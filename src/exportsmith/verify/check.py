"""Verify one generated decoder LM against the original: eager identity, export, numerics at other shapes, save/load.

`verify_model(model_type, package)` builds the original `<X>ForCausalLM` of the installed transformers and the
same-named class of `<package>.<module>` from one tiny config with the same weights, then:

1. eager identity: at every case both give bit-identical logits and cache tensors, and the cache is transformers'
   own `DynamicCache` (pytree registrations are keyed by exact class);
2. exports the generated copy twice with dynamic shapes, non-strict: decode (with a cache) and prefill (no cache);
3. runs each program at shapes other than its example and compares logits and every cache tensor with the original's
   eager output: a silently specialised branch shows up here as a mismatch, a guard as a rejected case;
4. saves and loads the decode program and runs one case on the loaded one.

It stops at the first failing stage and never raises: any exception becomes a failed `VerifyResult`. It refuses
(as a `build` failure) model types that are not decoder LMs and packages that do not register `DynamicCache` as a
pytree node on import.
"""

import importlib
import math
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field

import torch
from torch.utils import _pytree as pytree
from transformers import DynamicCache
from transformers.models.auto.configuration_auto import model_type_to_module_name
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from exportsmith.verify.inputs import DECODE_CASES, DECODE_EXAMPLE, PREFILL_CASES, PREFILL_EXAMPLE, Case, case_inputs
from exportsmith.verify.shapes import dynamic_shapes_like
from exportsmith.verify.tiny import tiny_config

# Exported programs run the same float32 kernels as eager, but decompositions and shape-dependent kernel choices may
# reorder reductions: allow rounding-level differences, far below what a wrong branch or mask produces.
MAX_ABS_DIFF = 1e-5

FAILURE_KINDS = ("build", "eager-mismatch", "export-error", "mismatch", "guard-rejected", "save-load")

PROGRAMS = {"decode": (DECODE_EXAMPLE, DECODE_CASES), "prefill": (PREFILL_EXAMPLE, PREFILL_CASES)}

# Dim.DYNAMIC for every size: named Dims fail with constraint violations, because the mask length is past + new
# tokens, and two Dims cannot be added to say so.
BATCH_AND_LENGTH = {0: torch.export.Dim.DYNAMIC, 1: torch.export.Dim.DYNAMIC}


def cache_tensor_dims(tensor: torch.Tensor) -> dict | None:
    """Key/value tensors are [batch, kv_heads, past, head_dim]: batch and past vary."""
    return {0: torch.export.Dim.DYNAMIC, 2: torch.export.Dim.DYNAMIC} if tensor.dim() == 4 else None


# Per forward keyword: the dims of each of its tensors. Keywords not listed (use_cache) are static.
INPUT_DIMS = {
    "input_ids": lambda _: BATCH_AND_LENGTH,
    "attention_mask": lambda _: BATCH_AND_LENGTH,
    "cache": cache_tensor_dims,
}


@dataclass
class CaseRecord:
    """One exported program run at one case: max |diff| to the original's eager output, or the error it raised."""

    program: str
    name: str
    batch: int
    new_tokens: int
    past: int
    max_diff: float | None = None
    error: str | None = None


@dataclass
class VerifyResult:
    """The verdict on one model; `failure` is one of FAILURE_KINDS, `message` says where and why."""

    model_type: str
    ok: bool = False
    eager_identical: bool = False
    cases: list[CaseRecord] = field(default_factory=list)
    export_seconds: dict[str, float] = field(default_factory=dict)
    failure: str | None = None
    message: str = ""

    @property
    def max_diff(self) -> float | None:
        diffs = [case.max_diff for case in self.cases if case.max_diff is not None]
        return max(diffs) if diffs else None

    @property
    def summary(self) -> str:
        if not self.ok:
            return f"{self.model_type}: FAIL {self.failure}: {self.message}"
        seconds = ", ".join(f"{program} {s:.1f}s" for program, s in self.export_seconds.items())
        return f"{self.model_type}: ok max|diff|={self.max_diff:.3g} ({seconds})"

    def record(self) -> dict:
        """The deterministic part of the result (no timings), for `generated/<model>/VERIFY.json`."""
        return {
            "model_type": self.model_type,
            "ok": self.ok,
            "failure": self.failure,
            "message": self.message,
            "eager_identical": self.eager_identical,
            "cases": [asdict(case) for case in self.cases],
        }

    def fail(self, kind: str, message: str) -> "VerifyResult":
        if kind not in FAILURE_KINDS:
            raise ValueError(f"unknown failure kind {kind!r}")
        self.ok, self.failure, self.message = False, kind, message
        return self


def first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


def verify_model(model_type: str, package: str = "generated") -> VerifyResult:
    """Verify `<package>.<module>`'s CausalLM class of `model_type`; never raises."""
    result = VerifyResult(model_type)
    try:
        original, generated = build_pair(model_type, package)
    except Exception as error:
        return result.fail("build", first_line(error))
    try:
        references = eager_references(original, generated)
    except Exception as error:
        return result.fail("eager-mismatch", str(error))
    result.eager_identical = True

    exported, export_errors = export_and_compare(original, generated, references, result)
    if export_errors:
        return result.fail("export-error", "; ".join(export_errors))
    # A wrong result is worse than a refused input: report mismatches first.
    mismatched = [r for r in result.cases if r.max_diff is not None and not r.max_diff <= MAX_ABS_DIFF]
    if mismatched:
        return result.fail(
            "mismatch", "; ".join(f"{r.program} {r.name}: max|diff|={r.max_diff:.3g}" for r in mismatched)
        )
    rejected = [r for r in result.cases if r.error is not None]
    if rejected:
        return result.fail("guard-rejected", "; ".join(f"{r.program} {r.name}: {r.error}" for r in rejected))
    try:
        diff = save_load_diff(exported["decode"], original, references)
    except Exception as error:
        return result.fail("save-load", first_line(error))
    if not diff <= MAX_ABS_DIFF:
        return result.fail("save-load", f"loaded decode program: max|diff|={diff:.3g}")
    result.ok = True
    return result


def build_pair(model_type: str, package: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The original and the generated CausalLM of a tiny config, with the same weights, in eval mode."""
    config = tiny_config(model_type)
    module = model_type_to_module_name(model_type)
    class_name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]
    original_class = getattr(importlib.import_module(f"transformers.models.{module}.modeling_{module}"), class_name)
    generated_class = getattr(importlib.import_module(f"{package}.{module}"), class_name)
    if DynamicCache not in pytree.SUPPORTED_NODES:
        raise RuntimeError(f"importing {package} did not register DynamicCache as a pytree node")
    torch.manual_seed(0)
    original = original_class(config).eval()
    generated = generated_class(config).eval()
    keys = generated.load_state_dict(original.state_dict(), strict=False)
    if keys.missing_keys or keys.unexpected_keys:
        raise RuntimeError(f"state dict: missing {keys.missing_keys}, unexpected {keys.unexpected_keys}")
    return original, generated


def eager_references(original: torch.nn.Module, generated: torch.nn.Module) -> dict:
    """The original's output at every (program, case); raises at the first case where the copy's is not identical."""
    references = {}
    for program, (_, cases) in PROGRAMS.items():
        for case in cases:
            try:
                references[program, case] = eager_reference(original, generated, case)
            except Exception as error:
                raise RuntimeError(f"{program} {case.name}: {first_line(error)}") from error
    return references


def eager_reference(original: torch.nn.Module, generated: torch.nn.Module, case: Case):
    """The original's output at `case`; raises unless the generated copy's output is bit-identical."""
    vocab_size = original.config.vocab_size
    with torch.no_grad():
        expected = original(**case_inputs(original, vocab_size, case))
        actual = generated(**case_inputs(original, vocab_size, case))
    if type(actual.cache) is not DynamicCache:
        raise TypeError(f"cache is {type(actual.cache).__qualname__}, not transformers' DynamicCache")
    expected_tensors, actual_tensors = compared_tensors(expected), compared_tensors(actual)
    if len(expected_tensors) != len(actual_tensors) or not all(
        e.shape == a.shape and torch.equal(e, a) for e, a in zip(expected_tensors, actual_tensors)
    ):
        raise AssertionError(f"outputs differ, max|diff|={max_abs_diff(expected, actual):.3g}")
    return expected


def export_and_compare(
    original: torch.nn.Module, generated: torch.nn.Module, references: dict, result: VerifyResult
) -> tuple[dict[str, torch.export.ExportedProgram], list[str]]:
    """Export each program of `generated`, record its time and a CaseRecord per case; -> (programs, export errors)."""
    vocab_size = original.config.vocab_size
    exported, export_errors = {}, []
    for program, (example, cases) in PROGRAMS.items():
        try:
            started = time.perf_counter()
            exported[program] = export_program(generated, case_inputs(original, vocab_size, example))
            result.export_seconds[program] = time.perf_counter() - started
            runnable = exported[program].module()
        except Exception as error:
            export_errors.append(f"{program}: {first_line(error)}")
            continue
        for case in cases:
            record = CaseRecord(program, case.name, case.batch, case.new_tokens, case.past)
            try:
                with torch.no_grad():
                    actual = runnable(**case_inputs(original, vocab_size, case))
                record.max_diff = max_abs_diff(references[program, case], actual)
            except Exception as error:
                record.error = first_line(error)
            result.cases.append(record)
    return exported, export_errors


def compared_tensors(output) -> list[torch.Tensor]:
    """The logits, then every tensor of the returned cache in pytree order."""
    return [output.logits] + [leaf for leaf in pytree.tree_leaves(output.cache) if isinstance(leaf, torch.Tensor)]


def max_abs_diff(expected, actual) -> float:
    """Largest |difference| over logits and cache tensors; inf if their number or shapes differ."""
    expected_tensors, actual_tensors = compared_tensors(expected), compared_tensors(actual)
    if len(expected_tensors) != len(actual_tensors):
        return math.inf
    diff = 0.0
    for e, a in zip(expected_tensors, actual_tensors):
        if e.shape != a.shape:
            return math.inf
        if e.numel():
            diff = max(diff, (e.double() - a.double()).abs().max().item())
    return diff


def export_program(model: torch.nn.Module, example: dict) -> torch.export.ExportedProgram:
    dynamic_shapes = {
        name: dynamic_shapes_like(value, INPUT_DIMS[name]) if name in INPUT_DIMS else None
        for name, value in example.items()
    }
    return torch.export.export(model, (), example, dynamic_shapes=dynamic_shapes, strict=False)


def save_load_diff(program: torch.export.ExportedProgram, original: torch.nn.Module, references: dict) -> float:
    """Max |diff| of the saved-and-loaded decode program at the 1-token decode step."""
    case = DECODE_CASES[1]
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "decode.pt2")
        torch.export.save(program, path)
        loaded = torch.export.load(path)
    with torch.no_grad():
        actual = loaded.module()(**case_inputs(original, original.config.vocab_size, case))
    return max_abs_diff(references["decode", case], actual)
