"""Verify one model type: eager identity, export with dynamic shapes, the program vs eager at other shapes, save/load.

`verify_model(model_type, package, subject)` builds the model class `tasks.model_class` picks for the type from its
tiny config, seeded, and checks one *subject* (a column of the coverage table):

- "generated": the same-named class of `<package>.<module>` (the vendored copy) with the original's weights (its state
  dict, and the modules it holds outside its module tree: `copy_unregistered_modules`), exported with plain
  `torch.export.export(strict=False)`; its eager outputs must be bit-identical to the original's;
- "original": transformers' own class, plain `torch.export.export(strict=False)`, no help;
- "dynamo-exporter": transformers' own class through `transformers.exporters.DynamoExporter` (its runtime patches),
  with `DynamoConfig(dynamic=True)`, the configuration its documentation shows.

Programs: a causal LM whose forward takes a cache (`cache`, or `past_key_values` in transformers 4.x) gets two, decode
(a cache built by the subject, the original or its copy, on a seeded prefix) and prefill (no cache), at the cases of
`inputs.py`; an encoder-decoder LM gets decode (encoder outputs and an `EncoderDecoderCache` built the same way) and
forward;
every other model gets one, "forward", at the `FORWARD_SHAPES` of dummy inputs (`tasks.dummy_inputs`), and at 1 and 2
tokens when it takes text (`FORWARD_EDGE_SHAPES`, left out where the original refuses them in eager). The first
case of a program is its export example (sizes >= 2, its tensors made contiguous); a dim whose size differs between
the program's cases is exported dynamic, every other dim static. Each program is exported in each of the dynamic-shape
styles users write (`DIM_STYLES`: named `Dim`s with min 1 for the batch and the new tokens, `Dim.DYNAMIC`,
`Dim.AUTO`), and each export is run at every case: a failure names the style when it is not the primary one. A case
matches when its max |diff| to eager is within rounding (`tolerance.allowed`: relative to the outputs' magnitude).

Stages, and the failure kind each reports (the first failing stage ends the check; nothing raises):
refused (the tiny model would exceed the memory budget); build; eager (the original cannot run its own inputs); eager-mismatch (the generated copy is not bit-identical);
export-error (exception type, first line, and the innermost frame of transformers or the generated package);
mismatch (the program disagrees with eager at its own example); silent-specialisation (it agrees at the example and
disagrees at another shape: exported, and wrong); guard-rejected (it refuses another shape); save-load (the first
program, saved and loaded in a fresh process that imports only the package, disagrees or fails); greedy-mismatch (an
LM's greedy loops driven by its programs, see `greedy.py`, give other tokens than transformers' generate, or fail).

A guard-rejected program, and an export refused because the code pins a dim declared dynamic ("Constraints
violated"), carry the guard at fault and the line that made it (`guards.guard_source`: location, line text, and
whether the line is a branch's test) in `VerifyResult.guard`; its location is the result's location. The refused
export is explained by exporting the program again with those dims left to torch (`Dim.AUTO`) and finding the
guard that fails at one of the program's other cases.
"""

import importlib
import logging
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial

import torch
import transformers
from torch.utils import _pytree as pytree
from transformers import DynamicCache, PretrainedConfig
from transformers.utils import ModelOutput

from exportsmith.verify.encoder_outputs import decode_encoder_outputs, encoder_output_capture, greedy_encoder_outputs
from exportsmith.verify.errors import first_line, user_location
from exportsmith.verify.greedy import greedy_loops
from exportsmith.verify.guards import GuardLog, guard_source
from exportsmith.verify.inputs import DECODE_CASES, ONE_TOKEN_DECODE_EXAMPLE, PREFILL_CASES, cache_keyword, case_inputs
from exportsmith.verify.inputs import output_cache, step_gap
from exportsmith.verify.real import window_cases
from exportsmith.verify.shapes import dynamic_shapes_like, with_named_inputs
from exportsmith.verify.tasks import AUDIO_LAYOUTS, EXAMPLE, InputShape, config_for, dummy_inputs, model_class
from exportsmith.verify.tasks import forward_parameters, takes_audio, vocab
from exportsmith.verify.tiny import TooLarge, build_tiny_model, tiny_config
from exportsmith.verify.tolerance import ATOL, allowed

# The tolerance's absolute part (tolerance.py): what a case whose outputs are all near 0 may differ by
MAX_ABS_DIFF = ATOL

SUBJECTS = ("original", "dynamo-exporter", "generated")
FAILURE_KINDS = (
    "refused",
    "build",
    "eager",
    "eager-mismatch",
    "export-error",
    "mismatch",
    "silent-specialisation",
    "guard-rejected",
    "save-load",
    "greedy-mismatch",
)

# The evaluation sets of a "forward" program: the example, then batch 1 and batch 3 with other text lengths (media
# sizes come from the config and stay fixed).
FORWARD_SHAPES = (
    EXAMPLE,
    InputShape(batch=1, text_length=5, decoder_length=3, seed=1),
    InputShape(batch=3, text_length=11, decoder_length=6, seed=2),
)
# ... and, for a model that takes text, the low end of the range the named dims declare (`Dim("tokens", min=1)`): one
# and two tokens (one decoder token: the first step of a generation). Optional cases: a model whose own eager forward
# refuses them (a convolution wider than one token) leaves them out of its range.
FORWARD_EDGE_SHAPES = (
    InputShape(batch=1, text_length=1, decoder_length=1, seed=3),
    InputShape(batch=1, text_length=2, decoder_length=2, seed=4),
)


@dataclass(frozen=True)
class Case:
    """One evaluation set of a program; `inputs()` builds fresh forward kwargs (a forward grows a given cache)."""

    name: str
    batch: int
    new_tokens: int  # text tokens of the call (new tokens of a decode step)
    past: int
    inputs: Callable[[], dict]
    optional: bool = False  # an edge of the range: left out where the original's eager forward fails it


@dataclass(frozen=True)
class Program:
    name: str
    cases: tuple[Case, ...]  # cases[0] is the export example
    max_tokens: int | None = None  # the longest text the model takes (its learned positions), where it is known


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
    dims: str | None = None  # the dynamic-shape style the program was exported with (DIM_STYLES); None: an exporter's
    tolerance: float = ATOL  # the rounding allowed at this case (tolerance.allowed of eager's outputs)

    @property
    def wrong(self) -> bool:
        return self.max_diff is not None and not self.max_diff <= self.tolerance


@dataclass
class VerifyResult:
    """The verdict on one model and subject; `failure` is one of FAILURE_KINDS, `message` says why, `location` where."""

    model_type: str
    subject: str = "generated"
    model_class: str | None = None
    ok: bool = False
    eager_identical: bool = False
    cases: list[CaseRecord] = field(default_factory=list)
    export_seconds: dict[str, float] = field(default_factory=dict)
    failure: str | None = None
    message: str = ""
    location: str | None = None
    guard: dict | None = None  # a guard failure's provenance (guards.GuardSource.record())
    greedy: list[dict] = field(default_factory=list)  # an LM's greedy loops (greedy.GreedyRecord), once they ran
    outside_range: list[str] = field(default_factory=list)  # optional cases the original's eager forward fails

    @property
    def max_diff(self) -> float | None:
        diffs = [case.max_diff for case in self.cases if case.max_diff is not None]
        return max(diffs) if diffs else None

    @property
    def summary(self) -> str:
        if not self.ok:
            where = f" at {self.location}" if self.location else ""
            if self.guard and self.guard["line"]:
                where += f" ({self.guard['construct']}: {self.guard['line']})"
            return f"{self.model_type}: FAIL {self.failure}: {self.message}{where}"
        seconds = ", ".join(f"{program} {s:.1f}s" for program, s in self.export_seconds.items())
        return f"{self.model_type}: ok max|diff|={self.max_diff:.3g} ({seconds})"

    def record(self) -> dict:
        """The deterministic part of the result (no timings), for VERIFY.json and coverage records."""
        return {
            "model_type": self.model_type,
            "subject": self.subject,
            "model_class": self.model_class,
            "ok": self.ok,
            "failure": self.failure,
            "message": self.message,
            "location": self.location,
            "guard": self.guard,
            "eager_identical": self.eager_identical,
            "cases": [asdict(case) for case in self.cases],
            "greedy": self.greedy,
            **({"outside_range": self.outside_range} if self.outside_range else {}),
        }

    def fail(self, kind: str, message: str, location: str | None = None) -> "VerifyResult":
        if kind not in FAILURE_KINDS:
            raise ValueError(f"unknown failure kind {kind!r}")
        self.ok, self.failure, self.message, self.location = False, kind, message, location
        return self


def verify_model(
    model_type: str,
    package: str = "generated",
    subject: str = "generated",
    config: PretrainedConfig | None = None,
    styles: tuple[str, ...] | None = None,
    imports: tuple[str, ...] = (),
) -> VerifyResult:
    """Verify `subject` (see SUBJECTS) of `model_type`, built from `config` (default: its tiny config; a real one,
    `real.py`, adds the cases that cross its sliding window), its programs exported in `styles` (default: every one of
    `styles_of(subject)`); `imports`: modules the process that loads a saved program imports after the package or the
    model's module (one that registers transformers' caches with its exporters); never raises."""
    if subject not in SUBJECTS:
        raise ValueError(f"unknown subject {subject!r}; one of {', '.join(SUBJECTS)}")
    result = VerifyResult(model_type, subject)
    where = ("transformers", package)  # the packages whose frames locate a failure
    extra = window_cases(config) if config is not None else ((), ())
    # For a generated copy, a failure before export says whose it is: transformers' own class failing alike is a limit
    # of the harness (its tiny config, its inputs), the copy failing alone is the rewrite's
    alike = (
        " (transformers' own class fails alike: the harness's limit, not the rewrite's)"
        if subject == "generated"
        else ""
    )
    try:
        original, built_from = build_original(model_type, config)
        result.model_class = type(original).__name__
    except TooLarge as error:
        return result.fail("refused", str(error))
    except Exception as error:
        return result.fail("build", first_line(error) + alike, user_location(error, where))
    generated = None
    if subject == "generated":
        try:
            generated = build_copy(original, built_from, package, share=config is not None)
        except Exception as error:
            message = f"{first_line(error)} (the generated copy; transformers' own class builds)"
            return result.fail("build", message, user_location(error, where))
    subject_model = generated if generated is not None else original
    try:
        references = {}
        original_programs = programs_for(original, extra=extra)
        for program in original_programs:
            for case in program.cases:
                try:
                    references[program.name, case.name] = run(original, case.inputs())
                except Exception as error:
                    if not case.optional:
                        raise
                    result.outside_range.append(f"{program.name} {case.name}: {first_line(error)}")
    except Exception as error:
        return result.fail("eager", first_line(error) + alike, user_location(error, where))
    if any(case.name == ONE_TOKEN_DECODE_EXAMPLE.name for program in original_programs for case in program.cases):
        gap, rounding = step_gap(original, vocab(original.config))
        result.outside_range.append(
            f"decode: steps of several new tokens (eager's differs from its one-token steps by max|diff|={gap:.3g}, "
            f"rounding {rounding:.2g}): one token at a time, as generate() decodes"
        )
    try:
        # the same cases, with the subject's own cache (a generated copy's layers are its own classes)
        programs = in_range(programs_for(original, cache_model=subject_model, extra=extra), references)
    except Exception as error:
        return result.fail("eager", f"{first_line(error)} (the generated copy's cache)", user_location(error, where))
    if generated is not None:
        try:
            check_eager_identity(original, generated, programs, references)
        except Exception as error:
            return result.fail("eager-mismatch", str(error))
    result.eager_identical = generated is not None
    # what a process that loads the saved program imports first: the package (the README's `import torch, generated`),
    # or, for transformers' own class, the module that defines it (`from transformers import X` imports it)
    imports = (package if generated is not None else type(original).__module__, *imports)
    return check_programs(result, subject_model, programs, references, where, original, styles, imports)


def check_programs(
    result: VerifyResult,
    model: torch.nn.Module,
    programs: list[Program],
    references: dict,
    where: tuple[str, ...],
    original: torch.nn.Module | None = None,
    styles: tuple[str, ...] | None = None,
    imports: tuple[str, ...] = (),
) -> VerifyResult:
    """Export each program of `model` the way `result.subject` does, in each dynamic-shape style of `styles_of`, run
    it at its cases against `references` ((program, case) -> eager output), save the first program of the first
    style and load it in a fresh process that imports `imports` first (`save_and_load`), and for an LM run greedy
    loops with the first style's programs against `original`'s generate (`model` by default); the verdict goes in
    `result`, frames of the packages `where` names locate failures."""
    subject, subject_model = result.subject, model
    styles = styles_of(subject) if styles is None or subject == "dynamo-exporter" else styles
    exported, export_errors = {}, []
    for style in styles:
        for program in programs:
            try:
                started = time.perf_counter()
                exported[program.name, style] = export_subject(subject, subject_model, program, style)
                if style == styles[0]:
                    result.export_seconds[program.name] = time.perf_counter() - started
                runnable = runnable_of(exported[program.name, style])
            except Exception as error:
                export_errors.append((program.name, style, error))
                continue
            for case in program.cases:
                record = CaseRecord(program.name, case.name, case.batch, case.new_tokens, case.past, dims=style)
                try:
                    reference = references[program.name, case.name]
                    record.tolerance = allowed(output_tensors(reference))
                    record.max_diff = max_abs_diff(reference, run(runnable, case))
                except Exception as error:
                    record.error = first_line(error)
                result.cases.append(record)
    if export_errors:
        message = "; ".join(
            f"{_label(name, style, styles)}: {export_message(error)}" for name, style, error in export_errors
        )
        name, style, error = export_errors[0]
        if is_constraint_violation(error) and subject != "dynamo-exporter":
            program = next(p for p in programs if p.name == name)
            result.guard = pinned_dim_guard(subject_model, program, where, style)
        location = user_location(error, where) or (result.guard or {}).get("location")
        return result.fail("export-error", message, location)
    # A wrong result is worse than a refused input: report mismatches first.
    wrong = [r for r in result.cases if r.wrong]
    if wrong:
        examples = {program.cases[0].name for program in programs}
        kind = "mismatch" if any(r.name in examples for r in wrong) else "silent-specialisation"
        message = "; ".join(f"{_label(r.program, r.dims, styles)} {r.name}: max|diff|={r.max_diff:.3g}" for r in wrong)
        return result.fail(kind, message)
    rejected = [r for r in result.cases if r.error is not None]
    if rejected:
        first = rejected[0]
        if not hasattr(exported[first.program, first.dims], "save_pretrained"):  # an ExportedProgram
            program = next(p for p in programs if p.name == first.program)
            names = {r.name for r in rejected if (r.program, r.dims) == (first.program, first.dims)}
            cases = [c for c in program.cases if c.name in names]
            result.guard = traced_guard(subject, subject_model, program, cases, where, first.dims)
        message = "; ".join(f"{_label(r.program, r.dims, styles)} {r.name}: {r.error}" for r in rejected)
        return result.fail("guard-rejected", message, (result.guard or {}).get("location"))
    try:
        program = programs[0]
        case = program.cases[1 if len(program.cases) > 1 else 0]
        loaded = save_and_load(exported[program.name, styles[0]], case, imports)
        diff = max_abs_diff(references[program.name, case.name], loaded)
    except Exception as error:
        return result.fail("save-load", first_line(error))
    if not diff <= allowed(output_tensors(references[program.name, case.name])):
        return result.fail("save-load", f"loaded {program.name} program at {case.name}: max|diff|={diff:.3g}")
    runnables = {program.name: runnable_of(exported[program.name, styles[0]]) for program in programs}
    loops = lm_greedy_loops(model if original is None else original, runnables, ATOL, model)
    result.greedy = [asdict(loop) for loop in loops]
    failed = [loop for loop in loops if not loop.ok]
    if failed:
        return result.fail("greedy-mismatch", "; ".join(loop.describe() for loop in failed))
    result.ok = True
    return result


def lm_greedy_loops(
    original: torch.nn.Module, runnables: dict[str, Callable], tolerance: float, subject: torch.nn.Module
) -> list:
    """The greedy loops (greedy.GreedyRecord) of a decoder LM's prefill and decode, or an encoder-decoder LM's forward
    and decode, driven by `runnables` (program name -> callable) of `subject` (the model exported) against
    `original`'s generate; none for other models."""
    if set(runnables) not in ({"decode", "prefill"}, {"decode", "forward"}):
        return []
    first = "prefill" if "prefill" in runnables else "forward"
    return greedy_loops(
        original,
        runnables[first],
        runnables["decode"],
        encoder_decoder=first == "forward",
        vocab_size=vocab(original.config),
        tolerance=tolerance,
        encoder_inputs=media_encoder_inputs(original) if first == "forward" else None,
        encoder_outputs=partial(greedy_encoder_outputs, subject),
    )


def media_encoder_inputs(model: torch.nn.Module) -> Callable[[int], dict] | None:
    """For an encoder-decoder whose encoder takes audio or images (beside a prompt or not: florence2), its forward
    program's seeded inputs at a given batch (what its greedy loops encode); None for a text encoder (the loops draw
    prompts)."""
    layout = audio_layout(model)
    if model.main_input_name == "input_ids" and set(dummy_inputs(model, layout, InputShape(batch=1))) <= TEXT_INPUTS:
        return None
    return lambda batch: dummy_inputs(model, layout, InputShape(batch=batch, seed=batch))


# What an encoder-decoder that takes nothing but text takes
TEXT_INPUTS = frozenset({"input_ids", "attention_mask", "decoder_input_ids", "decoder_attention_mask"})


MODELS_PACKAGE = "transformers.models."


def build_pair(
    model_type: str, package: str | None, config: PretrainedConfig | None = None
) -> tuple[torch.nn.Module, torch.nn.Module | None]:
    """The original model of `config` (default: the type's tiny config) and, with `package`, its generated copy with
    the same weights (eval)."""
    share = config is not None
    original, config = build_original(model_type, config)
    return original, build_copy(original, config, package, share) if package is not None else None


def build_original(
    model_type: str, config: PretrainedConfig | None = None
) -> tuple[torch.nn.Module, PretrainedConfig]:
    """transformers' model of `config` (default: the type's tiny config, within the parameter budget), eval, and the
    config it was built from. A given config is a real one (`real.py`): no parameter budget."""
    _, original_class = model_class(model_type)
    budget = config is None
    config = config_for(original_class, tiny_config(model_type) if budget else config)
    return build_tiny_model(original_class, config, budget=budget), config


def build_copy(original: torch.nn.Module, config: PretrainedConfig, package: str, share: bool) -> torch.nn.Module:
    """The generated copy in `package` of `original` (built from `config`), with the same weights, eval; with `share`
    (real configs), the copy holds the original's tensors instead of a second set (Mixtral's layer is 6.7 GB)."""
    original_class = type(original)
    # The copy of the module that defines the class: a part of a model (AltRobertaModel) is not in its package's
    # __init__, and some model types live in another model's directory (gpt-sw3 in gpt2)
    source = original_class.__module__
    if not source.startswith(MODELS_PACKAGE):
        raise LookupError(f"{original_class.__name__} is defined in {source}, outside {MODELS_PACKAGE.rstrip('.')}")
    module = f"{package}.{source.removeprefix(MODELS_PACKAGE)}"
    generated_module = importlib.import_module(module)
    generated_class = getattr(generated_module, original_class.__name__, None)
    if generated_class is None:
        raise LookupError(f"{module} has no {original_class.__name__}")
    if DynamicCache not in pytree.SUPPORTED_NODES:
        raise RuntimeError(f"importing {package} did not register DynamicCache as a pytree node")
    if share:
        with torch.device("meta"):
            generated = generated_class(config).eval()
        keys = generated.load_state_dict(original.state_dict(), strict=False, assign=True)
        share_buffers(original, generated)
    else:
        generated = generated_class(config).eval()
        keys = generated.load_state_dict(original.state_dict(), strict=False)
    if keys.missing_keys or keys.unexpected_keys:
        raise RuntimeError(f"state dict: missing {keys.missing_keys}, unexpected {keys.unexpected_keys}")
    copy_unregistered_modules(original, generated)
    return generated


def share_buffers(original: torch.nn.Module, copy: torch.nn.Module) -> None:
    """Give `copy`, built on `meta`, the original's buffers that the state dict does not hold (non-persistent ones,
    such as rotary frequencies), by module path and name."""
    for name, buffer in copy.named_buffers():
        if buffer.is_meta:
            path, _, attribute = name.rpartition(".")
            copy.get_submodule(path)._buffers[attribute] = original.get_buffer(name)
    left = [name for name, tensor in [*copy.named_parameters(), *copy.named_buffers()] if tensor.is_meta]
    if left:
        raise RuntimeError(f"the copy has tensors the original does not: {', '.join(left[:5])}")


# What nn.Module.__init__ puts in an instance's __dict__ (its registries and hooks): the other attributes are the
# model's own
_MODULE_STATE = frozenset(vars(torch.nn.Module()))


def copy_unregistered_modules(original: torch.nn.Module, copy: torch.nn.Module) -> list[str]:
    """Load into `copy` the weights of the modules `original` holds outside its module tree, in a plain list, tuple or
    dict attribute, and return their paths. The state dict has no key for them, so `load_state_dict` leaves the copy's
    own random ones (oneformer's `OneFormerTransformerModule.input_projections`, a list of Conv2d when `conv_dim !=
    hidden_dim`: a transformers bug, see docs/TRANSFORMERS_BUGS.md). Modules of the tree referenced again from such an
    attribute (a list kept beside `add_module`) are already loaded and skipped."""
    seen = {id(module) for module in original.modules()}
    copied = []

    def visit(original_root: torch.nn.Module, copy_root: torch.nn.Module, root_path: str) -> None:
        for name, module in original_root.named_modules():
            twin = copy_root.get_submodule(name)
            for attribute in sorted(vars(module).keys() - _MODULE_STATE):
                value = vars(module)[attribute]
                if not _holds_module(value):
                    continue
                path = ".".join(part for part in (root_path, name, attribute) if part)
                for held_path, held, held_twin in _held_modules(path, value, getattr(twin, attribute)):
                    if id(held) in seen:
                        continue
                    seen.update(id(part) for part in held.modules())
                    held_twin.load_state_dict(held.state_dict())
                    copied.append(held_path)
                    visit(held, held_twin, held_path)

    visit(original, copy, "")
    return copied


def _holds_module(value) -> bool:
    if isinstance(value, (list, tuple)):
        return any(_holds_module(item) for item in value)
    if isinstance(value, dict):
        return any(_holds_module(item) for item in value.values())
    return isinstance(value, torch.nn.Module)


def _held_modules(path: str, value, twin):
    """(path, module, the copy's module at the same place) of each module in `value`, a module or a nest of lists,
    tuples and dicts; raises where the copy's structure differs."""
    if isinstance(value, torch.nn.Module):
        if type(twin).__qualname__ != type(value).__qualname__:
            raise RuntimeError(f"{path}: the copy holds {type(twin).__qualname__}, not {type(value).__qualname__}")
        yield path, value, twin
    elif isinstance(value, (list, tuple)):
        if not isinstance(twin, (list, tuple)) or len(twin) != len(value):
            raise RuntimeError(f"{path}: the copy holds {type(twin).__name__} of another length")
        for index, (item, twin_item) in enumerate(zip(value, twin)):
            yield from _held_modules(f"{path}[{index}]", item, twin_item)
    elif isinstance(value, dict):
        if not isinstance(twin, dict) or twin.keys() != value.keys():
            raise RuntimeError(f"{path}: the copy holds another {type(value).__name__}")
        for key, item in value.items():
            yield from _held_modules(f"{path}[{key!r}]", item, twin[key])


def programs_for(
    original: torch.nn.Module, cache_model: torch.nn.Module | None = None, extra: tuple[tuple, tuple] = ((), ())
) -> list[Program]:
    """Decode and prefill for a causal LM that takes a cache (built by `cache_model`, the original by default), at
    DECODE_CASES and PREFILL_CASES and the `extra` (decode, prefill) cases; decode (encoder outputs and an
    EncoderDecoderCache) and forward for an encoder-decoder LM; else one "forward" program over FORWARD_SHAPES."""
    parameters = forward_parameters(original)
    is_lm = (
        cache_keyword(original) is not None and getattr(original, "get_output_embeddings", lambda: None)() is not None
    )
    layout = audio_layout(original)
    if is_lm and not getattr(original.config, "is_encoder_decoder", False):
        vocab_size = vocab(original.config)  # a multimodal LM's is its text config's
        decode = DECODE_CASES + extra[0]
        if one_token_steps(original, vocab_size):
            decode = (ONE_TOKEN_DECODE_EXAMPLE, *(case for case in decode if case.new_tokens == 1))
        return [
            Program(name, tuple(lm_case(cache_model or original, vocab_size, case) for case in cases))
            for name, cases in (("decode", decode), ("prefill", PREFILL_CASES + extra[1]))
        ]
    if is_lm and "encoder_outputs" in parameters:
        # its forward starts a generation: with `use_cache=True`, as generate() calls it (a config may default to
        # False: pix2struct's forward then returns no cache, and no decode step could follow it)
        return [
            Program(
                "decode", tuple(seq2seq_case(cache_model or original, layout, case) for case in SEQ2SEQ_DECODE_CASES)
            ),
            forward_program(original, layout, caching=True),
        ]
    return [forward_program(original, layout)]


def one_token_steps(original: torch.nn.Module, vocab_size: int) -> bool:
    """Whether a decoder LM's decode range is one new token: where its eager step of several tokens after a cache
    is not (beyond rounding, `tolerance.allowed`) its one-token steps, a multi-token step is no step of a generation
    (generate() feeds one token at a time), and a program traced at one would be compared with the other path
    (Mamba's full scan from a zero state, against its recurrent update)."""
    gap, rounding = step_gap(original, vocab_size)
    return gap > rounding


def forward_program(original: torch.nn.Module, layout: int, caching: bool = False) -> Program:
    """The "forward" program over FORWARD_SHAPES, and FORWARD_EDGE_SHAPES for a model that takes text; with
    `caching`, its inputs ask for the cache (`use_cache=True`)."""
    text = {"input_ids", "decoder_input_ids"} & set(dummy_inputs(original, layout))
    cases = []
    for shape in FORWARD_SHAPES + (FORWARD_EDGE_SHAPES if text else ()):
        inputs = partial(dummy_inputs, original, layout, shape)
        if caching:
            inputs = partial(with_cache, inputs)
        optional = shape in FORWARD_EDGE_SHAPES
        cases.append(Case(shape_name(shape), shape.batch, shape.text_length, 0, inputs, optional))
    return Program("forward", tuple(cases), text_positions(original.config) if text else None)


def text_positions(config) -> int | None:
    """The number of positions of the model's text embeddings (`max_position_embeddings` and its aliases, of the
    config or its text config): the longest text it takes; None where the config does not say."""
    found = [
        value
        for owner in (config, getattr(config, "text_config", None))
        for name in ("max_position_embeddings", "n_positions", "n_ctx")
        if isinstance(value := getattr(owner, name, None), int) and value > 0
    ]
    return min(found, default=None)


def in_range(programs: list[Program], references: dict) -> list[Program]:
    """`programs` without the optional cases the original's eager forward failed (none in `references`)."""
    return [
        Program(p.name, tuple(c for c in p.cases if (p.name, c.name) in references), p.max_tokens) for p in programs
    ]


def with_cache(inputs: Callable[[], dict]) -> dict:
    """A forward's inputs with `use_cache=True`."""
    return {**inputs(), "use_cache": True}


def shape_name(shape: InputShape) -> str:
    return f"batch{shape.batch}-text{shape.text_length}"


# Decode steps of an encoder-decoder: (case, encoder text length). The encoder length varies too.
SEQ2SEQ_DECODE_CASES = (
    (DECODE_CASES[0], 8),
    (DECODE_CASES[1], 5),
    (DECODE_CASES[2], 11),
    (DECODE_CASES[3], 6),
    *zip(DECODE_CASES[5:], (3, 9, 2, 5)),  # the first steps of a generation
)


def seq2seq_case(original: torch.nn.Module, layout: int, case_and_length) -> Case:
    case, text_length = case_and_length
    shape = InputShape(case.batch, text_length, case.past + case.new_tokens, seed=case.batch * 100 + case.past)
    inputs = partial(seq2seq_inputs, original, layout, shape, case.past)
    return Case(case.name, case.batch, case.new_tokens, case.past, inputs)


def seq2seq_inputs(original: torch.nn.Module, layout: int, shape: InputShape, past: int) -> dict:
    """A decode step as `generate` makes it: the encoder's outputs (`encoder_outputs.decode_encoder_outputs`), the
    encoder's attention mask, the new decoder tokens and an EncoderDecoderCache of the `past` first ones, all from the
    original model on seeded full inputs."""
    full = dummy_inputs(original, layout, shape)
    decoder_ids = full.pop("decoder_input_ids")
    captured, hook = encoder_output_capture(original)
    try:
        with torch.no_grad():
            prefix = original(**full, decoder_input_ids=decoder_ids[:, :past], use_cache=True)
    finally:
        if hook is not None:
            hook.remove()
    inputs = {
        "encoder_outputs": (prefix.encoder_last_hidden_state,),
        # a fresh contiguous tensor, as a runtime feeds it: a view (the new tokens are a slice) makes export guard on
        # the sizes of the tensor it views, and the program then fails on a tensor that is no view
        "decoder_input_ids": decoder_ids[:, past:].clone(memory_format=torch.contiguous_format),
        cache_keyword(original): output_cache(prefix),
        "use_cache": True,
    }
    if "attention_mask" in full:
        inputs["attention_mask"] = full["attention_mask"]
    inputs["encoder_outputs"] = decode_encoder_outputs(original, captured[0] if captured else None, inputs)
    return inputs


def lm_case(cache_model: torch.nn.Module, vocab_size: int, case) -> Case:
    return Case(case.name, case.batch, case.new_tokens, case.past, partial(case_inputs, cache_model, vocab_size, case))


def audio_layout(model: torch.nn.Module) -> int:
    """The first audio layout (see tasks.AUDIO_LAYOUTS) the model runs at; 0 for models without audio."""
    if not takes_audio(model):
        return 0
    for layout in range(AUDIO_LAYOUTS - 1):
        try:
            run(model, dummy_inputs(model, layout))
            return layout
        except Exception:
            continue
    return AUDIO_LAYOUTS - 1


def run(model: Callable, inputs: dict | Case):
    """One seeded forward without grad (some models draw random numbers in eval, e.g. masked-autoencoder noise)."""
    if isinstance(inputs, Case):
        inputs = inputs.inputs()
    torch.manual_seed(0)
    with torch.no_grad():
        return model(**inputs)


def check_eager_identity(original, generated, programs: list[Program], references: dict) -> None:
    """Raise at the first case where the generated copy's output is not bit-identical to the original's."""
    for program in programs:
        for case in program.cases:
            expected, actual = references[program.name, case.name], run(generated, case)
            cache, actual_cache = output_cache(expected), output_cache(actual)
            if isinstance(cache, transformers.Cache) and not _same_or_registered_subclass(actual_cache, cache):
                # pytree registrations are keyed by exact class: the copy must return transformers' own cache, or a
                # subclass of it (a vendored cache_utils' own) that is registered itself
                raise TypeError(f"{program.name} {case.name}: cache is {type(actual_cache).__qualname__}")
            expected_tensors, actual_tensors = output_tensors(expected), output_tensors(actual)
            if len(expected_tensors) != len(actual_tensors) or not all(
                e.shape == a.shape and e.dtype == a.dtype and identical(e, a)
                for e, a in zip(expected_tensors, actual_tensors)
            ):
                diff = max_abs_diff(expected, actual)
                raise AssertionError(f"{program.name} {case.name}: outputs differ, max|diff|={diff:.3g}")


def _same_or_registered_subclass(actual, expected) -> bool:
    kind, expected_kind = type(actual), type(expected)
    if kind is expected_kind:
        return True
    # a model's own cache class (MiniMaxCache) is the copy's own class in a generated copy, registered by it
    copied = kind.__qualname__ == expected_kind.__qualname__ and expected_kind.__module__.startswith(MODELS_PACKAGE)
    return (isinstance(actual, expected_kind) or copied) and kind in pytree.SUPPORTED_NODES


def output_tensors(output) -> list[torch.Tensor]:
    """Every tensor of an output in a fixed order: pytree leaves, and the attributes (by name) of other objects, such
    as a cache, whether a pytree node or not (so that a registered copy of a model's own cache compares with the
    unregistered original)."""
    tensors = []
    for leaf in pytree.tree_leaves(output, is_leaf=_is_object):
        if isinstance(leaf, torch.Tensor):
            tensors.append(leaf)
        elif hasattr(leaf, "__dict__") and not isinstance(leaf, (torch.nn.Module, type)):
            tensors.extend(output_tensors([value for _, value in sorted(vars(leaf).items())]))
    return tensors


def _is_object(node) -> bool:
    """A node other than a container or a model output (which transformers registers as a dict)."""
    return pytree._get_node_type(node) not in pytree.BUILTIN_TYPES and not isinstance(node, ModelOutput)


def max_abs_diff(expected, actual) -> float:
    """Largest |difference| over the outputs' tensors; inf if their number or shapes differ."""
    expected_tensors, actual_tensors = output_tensors(expected), output_tensors(actual)
    if len(expected_tensors) != len(actual_tensors):
        return math.inf
    diff = 0.0
    for e, a in zip(expected_tensors, actual_tensors):
        if e.shape != a.shape:
            return math.inf
        if e.numel() and (e.is_floating_point() or e.is_complex()):
            diff = max(diff, tensor_diff(e, a))
        elif e.numel() and not torch.equal(e, a):
            return math.inf
    return diff


def identical(expected: torch.Tensor, actual: torch.Tensor) -> bool:
    """Bit-identical values, NaN where the other has NaN (a tiny random model can give NaN: torch.equal says no)."""
    if torch.equal(expected, actual):
        return True
    if not (expected.is_floating_point() or expected.is_complex()) or expected.shape != actual.shape:
        return False
    nan = expected.isnan()
    return torch.equal(nan, actual.isnan()) and torch.equal(expected[~nan], actual[~nan])


def tensor_diff(expected: torch.Tensor, actual: torch.Tensor) -> float:
    """max |expected - actual| of two same-shaped float tensors; NaN on one side only, or an inf that differs, is inf
    (a plain max over NaN would be NaN, and `max(0.0, nan)` is 0.0: a NaN output must not pass)."""
    kind = torch.complex128 if expected.is_complex() else torch.float64
    expected, actual = expected.to(kind), actual.to(kind)
    if not torch.equal(expected.isnan(), actual.isnan()):
        return math.inf
    same = (expected == actual) | expected.isnan()  # also equal infs, whose difference is NaN
    return (expected - actual).abs().masked_fill(same, 0.0).max().item()


# The dynamic-shape styles users write, each a way to declare the dims that vary between a program's cases:
# - "named": `Dim("batch", min=1, max=32)` for the batch and `Dim("tokens", min=1, max=64)` for the new tokens (the
#   text length of a forward; the max grows to the program's longest case), shared by every input that has them,
#   `Dim.DYNAMIC` for the others (a cache's length, the attention mask's). A guard on a named dim that its range does
#   not imply is an export error. The bounds are the ones users write: a model with learned positions (bert's 512)
#   guards on the length, and an unbounded range would contradict it;
# - "dynamic": `Dim.DYNAMIC` everywhere (code that specialises a dim is an export error);
# - "auto": `Dim.AUTO` everywhere (torch specialises where the code does, and the program rejects other sizes).
# The first is the primary one: its programs are saved and loaded and drive the greedy loops.
DIM_STYLES = ("named", "dynamic", "auto")
BATCH = torch.export.Dim("batch", min=1, max=32)
TOKENS_MAX = 64


def tokens_dim(program: Program) -> torch.export.Dim:
    """The named style's dim of the new tokens: from 1 to 64, or to the program's longest case; to the longest text
    the model takes where that is shorter (owlvit's 16 positions: a user declares no range its embeddings refuse)."""
    longest = max(TOKENS_MAX, *(case.new_tokens for case in program.cases))
    if program.max_tokens is not None:
        longest = min(longest, max(program.max_tokens, *(case.new_tokens for case in program.cases)))
    return torch.export.Dim("tokens", min=1, max=longest)


def styles_of(subject: str) -> tuple[str | None, ...]:
    """The dynamic-shape styles a subject is exported in: DIM_STYLES for torch.export, none of ours (None) for
    DynamoExporter, which declares its own dims."""
    return (None,) if subject == "dynamo-exporter" else DIM_STYLES


def _label(program: str, style: str | None, styles: tuple[str | None, ...]) -> str:
    """A program's name in messages, with its dims style when it is not the primary one."""
    return program if style == styles[0] else f"{program} ({style} dims)"


def varying_dims(program: Program, style: str = "dynamic") -> dict:
    """`dynamic_shapes` for the example in `style` (DIM_STYLES) for each dim (of size >= 2) whose size differs between
    cases, Dim.AUTO for int leaves (cache counters); None for inputs whose structure differs between cases."""
    if style not in DIM_STYLES:
        raise ValueError(f"unknown dims style {style!r}; one of {', '.join(DIM_STYLES)}")
    all_inputs = [case.inputs() for case in program.cases]
    example = all_inputs[0]
    batches = [case.batch for case in program.cases]
    tokens = [case.new_tokens for case in program.cases]
    tokens_named = tokens_dim(program)

    def dim(sizes: list[int]):
        if style == "auto":
            return torch.export.Dim.AUTO
        if style == "named" and sizes == batches:
            return BATCH
        if style == "named" and sizes == tokens:
            return tokens_named
        return torch.export.Dim.DYNAMIC

    shapes = {}
    for name, value in example.items():
        leaves = pytree.tree_leaves(value)
        others = [pytree.tree_leaves(inputs.get(name)) for inputs in all_inputs[1:]]
        if any(len(other) != len(leaves) for other in others):
            shapes[name] = None
            continue
        dims = iter(
            [
                {
                    d: dim([leaf.shape[d], *(other[i].shape[d] for other in others)])
                    for d in range(leaf.dim())
                    if leaf.shape[d] >= 2 and any(other[i].shape[d] != leaf.shape[d] for other in others)
                }
                or None
                for i, leaf in enumerate(leaves)
                if isinstance(leaf, torch.Tensor)
            ]
        )
        shapes[name] = dynamic_shapes_like(value, lambda _: next(dims))
    return shapes


def export_subject(subject: str, model: torch.nn.Module, program: Program, style: str | None = "dynamic"):
    """`program` of `model` exported the way `subject` does it, its dims declared in `style`: an ExportedProgram, or
    DynamoExporter's ExportedModel."""
    if subject == "dynamo-exporter":
        from transformers.exporters.exporter_dynamo import DynamoConfig, DynamoExporter

        return DynamoExporter().export(model, program.cases[0].inputs(), DynamoConfig(dynamic=True))
    return export_program(model, program.cases[0].inputs(), varying_dims(program, style))


def export_program(model: torch.nn.Module, example: dict, dynamic_shapes: dict) -> torch.export.ExportedProgram:
    """`torch.export.export(strict=False)` of `model` at `example`, whose tensors are made contiguous first: a
    sliding-window cache that crossed its window holds views (eager crops with a slice), and a program traced with a
    view guards on its strides, so it would reject the contiguous caches programs return
    (`Guard failed: cache.layers[0].keys.stride()[1] != 16 * cache.layers[0].keys.size()[2]`). A program traced
    with contiguous tensors accepts views too."""
    model = with_named_inputs(model, example)
    example = pytree.tree_map_only(torch.Tensor, lambda tensor: tensor.contiguous(), example)
    return torch.export.export(model, (), example, dynamic_shapes=dynamic_shapes, strict=False)


# torch's line for a guard on a dim declared dynamic that not every value of the dim's range satisfies
_UNSATISFIED = re.compile(r"Not all values of (.*?) satisfy the generated guard (.*)\.$")
_RANGE = re.compile(r"^(\w+) = (.+?) in the specified range (?:(\d+) <= )?\1 <= (\d+)$")


def export_message(error: BaseException) -> str:
    """An export error's first line; for a dim the code pins ("Constraints violated"), also the first guard torch
    says not every value of the dim's range satisfies (the first line names only the dim), shortened, and whether
    it in fact holds over the whole range (torch could not prove it: docs/TORCH_BUGS.md #3)."""
    message = first_line(error)
    if is_constraint_violation(error):
        for line in str(error).splitlines():
            found = _UNSATISFIED.search(line.strip())
            if found:
                guard, name = found.group(2), found.group(1).split(" = ")[0]
                failing = first_failing_size(found.group(1), guard)
                verdict = (
                    " (true over the whole range: torch cannot prove it)"
                    if failing is False
                    else f" (false at {name} = {failing}: the code pins it)" if failing else ""
                )
                return f"{message} Unsatisfied for some {name}: {guard[:160]}{verdict}"
    return message


def first_failing_size(dim: str, guard: str) -> int | bool | None:
    """The first value of the dim's range at which `guard` is false, `guard` being torch's text of a guard on that one
    dim (`dim`: "tokens = L['x'].size()[1] in the specified range tokens <= 64"; min 1 when torch names no lower
    bound); False when it holds at every value (a guard torch failed to prove, not a pin); None when it involves other
    sizes or cannot be read."""
    found = _RANGE.match(dim.strip())
    if found is None or found.group(2) not in guard:
        return None
    expression = guard.replace(found.group(2), "size")
    if "L[" in expression or not re.fullmatch(r"[\w\s()+\-*/%<>=!.,]*", expression):
        return None
    low, high = int(found.group(3) or 1), int(found.group(4))
    try:
        code = compile(expression, "<guard>", "eval")
        names = {"__builtins__": {}, "min": min, "max": max}
        # torch's own text of a size expression: arithmetic, min and max over one int
        return next((size for size in range(low, high + 1) if not eval(code, names, {"size": size})), False)
    except Exception:
        return None


def is_constraint_violation(error: BaseException) -> bool:
    """Export refused a dim declared dynamic that the code pins (torch's UserError of CONSTRAINT_VIOLATION)."""
    from torch._dynamo.exc import UserError, UserErrorType

    return isinstance(error, UserError) and error.error_type == UserErrorType.CONSTRAINT_VIOLATION


def rejected_guard(exported: torch.export.ExportedProgram, log: GuardLog, cases: list[Case]) -> dict | None:
    """The guard of `exported` that the first of `cases` fails, with the line that made it (None if not found)."""
    try:
        found = guard_source(exported, log, [(case.name, case.inputs()) for case in cases])
    except Exception:
        return None
    return found.record() if found is not None else None


def traced_guard(
    subject: str,
    model: torch.nn.Module,
    program: Program,
    cases: list[Case],
    packages: tuple[str, ...],
    style: str | None = "dynamic",
) -> dict | None:
    """The guard of `program`'s export that the first of `cases` fails, with the line that made it. The program is
    exported again under a `GuardLog`: the log turns on torch's guard logging, whose stack summaries would slow every
    export the harness makes, so only a rejected program pays for it."""
    return logged_guard(lambda: export_subject(subject, model, program, style), packages, cases)


def pinned_dim_guard(
    model: torch.nn.Module, program: Program, packages: tuple[str, ...], style: str = "dynamic"
) -> dict | None:
    """The guard that pins a dim `program` declares dynamic in `style`: export it again with every dynamic dim left to
    torch (Dim.AUTO specialises where the code does, instead of failing), and find the guard one of the other cases
    fails."""
    dims = pytree.tree_map(
        lambda dim: (
            torch.export.Dim.AUTO if isinstance(dim, torch.export.Dim) or dim is torch.export.Dim.DYNAMIC else dim
        ),
        varying_dims(program, style),
        is_leaf=lambda node: node is None,
    )
    return logged_guard(
        lambda: export_program(model, program.cases[0].inputs(), dims), packages, list(program.cases[1:])
    )


def logged_guard(export, packages: tuple[str, ...], cases: list[Case]) -> dict | None:
    """`rejected_guard` of the program `export()` makes under a `GuardLog` (None when that export fails)."""
    try:
        with GuardLog(packages) as log:
            exported = export()
    except Exception:
        return None
    return rejected_guard(exported, log, cases)


def runnable_of(exported):
    """What runs an exported program with forward kwargs: `ep.module()`, or an exporter's ExportedModel itself."""
    return exported if hasattr(exported, "save_pretrained") else exported.module()


def save_and_load(exported, case: Case, imports: tuple[str, ...] = ()):
    """The outputs at `case` of the saved-and-loaded copy of an exported program. A torch.export program is loaded
    and run in a fresh Python process that imports torch and `imports` first, as a user's process would (`import torch,
    generated`): the harness's own process has imported the model modules, whose imports register what loading needs,
    and would hide a registration that the package alone does not make. transformers' exporter's ExportedModel is
    saved and loaded by its own save_pretrained / from_pretrained, in this process (its format is transformers')."""
    if hasattr(exported, "save_pretrained"):  # a transformers.exporters ExportedModel
        return run(runnable_of(_reloaded_exported_model(exported)), case)
    with tempfile.TemporaryDirectory() as directory:
        program, inputs, outputs = (
            os.path.join(directory, name) for name in ("program.pt2", "inputs.pt", "outputs.pt")
        )
        torch.export.save(exported, program)
        torch.save(plain_inputs(case.inputs()), inputs)
        # the harness's sys.path (where the package lives), in the order it has it; run from the temporary directory:
        # `python -c` puts its working directory first, and the harness's (a repository's root) may hold another
        # package of the same name (the coverage sweep's `build/coverage/generated` against the committed one)
        environment = {**os.environ, "PYTHONPATH": os.pathsep.join(os.path.abspath(path) for path in sys.path)}
        try:
            finished = subprocess.run(
                [sys.executable, "-c", FRESH_LOAD, ",".join(imports), program, inputs, outputs, str(os.getpid())],
                cwd=directory,
                env=environment,
                capture_output=True,
                text=True,
                timeout=FRESH_LOAD_TIMEOUT,
            )
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"a fresh process did not load and run the program in {FRESH_LOAD_TIMEOUT} s") from None
        if finished.returncode != 0:
            imported = ", ".join(("torch", *imports))
            raise RuntimeError(f"in a fresh process (import {imported}): {fresh_process_error(finished.stderr)}")
        # our own file, holding the package's and transformers' classes: not a weights-only load
        return torch.load(outputs, weights_only=False)


def plain_inputs(inputs: dict) -> dict:
    """`inputs` as a file a weights-only load reads: an input that is a ModelOutput (an encoder's outputs), which no
    weights-only load accepts (it is an OrderedDict subclass), as a dict of its fields with its class's name under
    MODEL_OUTPUT; the fresh process builds the object from them, as a runtime builds it from an encoder's outputs."""
    return {
        name: (
            {MODEL_OUTPUT: f"{type(value).__module__}:{type(value).__qualname__}", **value}
            if isinstance(value, ModelOutput)
            else value
        )
        for name, value in inputs.items()
    }


MODEL_OUTPUT = "__model_output__"  # FRESH_LOAD spells it too

# The fresh process: import what a user imports first, load the program, run it at the inputs (unpickled weights-only,
# as a runtime fed from a file would: a cache must be a safe global; a ModelOutput is built from its fields), save
# the outputs.
FRESH_LOAD = """
import importlib, os, sys
if sys.platform == "linux":  # die with the harness's process (a sweep kills a child that runs past its timeout)
    import ctypes, signal
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != int(sys.argv[5]):
        sys.exit("the harness's process has ended")
import torch
for module in filter(None, sys.argv[1].split(",")):
    importlib.import_module(module)
program = torch.export.load(sys.argv[2])
inputs = torch.load(sys.argv[3], weights_only=True)
for name, value in inputs.items():
    if isinstance(value, dict) and "__model_output__" in value:
        module, _, qualname = value.pop("__model_output__").partition(":")
        inputs[name] = getattr(importlib.import_module(module), qualname)(**value)
torch.manual_seed(0)
with torch.no_grad():
    torch.save(program.module()(**inputs), sys.argv[4])
"""
FRESH_LOAD_TIMEOUT = 300.0  # seconds

# A line torch's logging writes (`W1205 14:43:46.876000 5998 torch/export/__init__.py:348] message`): its prefix
_LOG_PREFIX = re.compile(r"^[DIWEC]\d{4} [\d:.]+ +\d+ \S+\] ?")
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w]*\.)*([A-Za-z_]\w*(?:Error|Exception)): (.*)")


# The line of a weights-only unpickling error that names what it refused (the exception's first line does not)
_UNPICKLER_LINE = re.compile(r"WeightsUnpickler error: (.*)")


def fresh_process_error(stderr: str) -> str:
    """The first exception a failed fresh process reports, in one short line: torch.export.load logs the error it met
    as a warning with its traceback and then raises a RuntimeError that only says to read the warnings."""
    lines = [_LOG_PREFIX.sub("", line) for line in stderr.splitlines()]
    for line in lines:
        found = _EXCEPTION_LINE.match(line)
        if found:
            kind, message = found.groups()
            refused = next((match.group(1) for match in map(_UNPICKLER_LINE.search, lines) if match), None)
            # the first sentence: torch's messages go on with advice, or a whole graph node
            message = (refused or message).split(". ")[0].rstrip(".")
            return f"{kind}: {message[:300]}"
    lines = [line for line in lines if line.strip()]
    return lines[-1] if lines else "it exited with no message"


def _reloaded_exported_model(exported):
    with tempfile.TemporaryDirectory() as directory:
        exported.save_pretrained(directory)
        # its example inputs hold a cache that torch unpickles weights-only, fails, retries, and then logs a
        # warning whose formatting itself fails with a traceback on stderr: silence that logger
        serde = logging.getLogger("torch._export.serde.serialize")
        serde.disabled, was_disabled = True, serde.disabled
        try:
            return type(exported).from_pretrained(directory, trust_remote_code=True)  # our own pickle
        finally:
            serde.disabled = was_disabled
