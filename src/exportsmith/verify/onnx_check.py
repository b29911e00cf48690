"""Verify one generated model through ONNX: `torch.onnx.export(dynamo=True)`, then ONNX Runtime vs eager.

`verify_onnx(model_type, package)` builds the original and the generated model exactly as `check.build_pair`
does, then for each program of `check.programs_for` (decode with a cache and prefill for a causal LM, else one
forward):

1. exports the generated copy with `torch.onnx.export(..., dynamo=True)` at the program's example, with the same
   dynamic dims as `check` (batch, new tokens, past length; the cache's int counters `Dim.AUTO`);
2. names the graph's inputs and outputs after their pytree key paths, the cache flattened to `past.layers.0.keys`,
   `past.layers.0.values`, ... on the way in and `present.layers.0.keys`, ... on the way out, next to `input_ids`,
   `attention_mask` and `logits` (the exporter's own output names are FX node names such as `linear_14`, `cat_3`);
3. runs it in ONNX Runtime on the CPU at every case of the program and compares every output (logits, cache
   tensors, int counters) by name with the ORIGINAL model's eager output at that case;
4. for a decoder LM or an encoder-decoder LM, runs `greedy.greedy_loops` with the sessions standing for the programs
   (`OrtProgram`: keyword inputs in, the model's output rebuilt with its cache out), against the original's
   `generate(do_sample=False)`: what a user who deploys the two ONNX graphs runs.

It never raises for a model's failure: a build error, an export error, an ORT error or a difference above
`ONNX_MAX_ABS_DIFF` becomes a failed `OnnxResult` (one of `FAILURE_KINDS`, with the first line of the error). It
refuses to run at all, raising `MissingOnnxDependencies`, when onnx, onnxscript or onnxruntime is not installed.
"""

import importlib
import logging
import math
import re
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import torch
from torch.export.graph_signature import ConstantArgument, InputKind, OutputKind
from torch.utils import _pytree as pytree

if TYPE_CHECKING:  # optional: the module imports without the onnx extra
    import onnxruntime

from exportsmith.verify.check import (
    Case,
    CaseRecord,
    Program,
    build_pair,
    in_range,
    lm_greedy_loops,
    programs_for,
    run,
    tensor_diff,
    varying_dims,
)
from exportsmith.verify.errors import first_line
from exportsmith.verify.shapes import with_named_inputs

ONNX_PACKAGES = ("onnx", "onnxscript", "onnxruntime")
INSTALL_HINT = "pip install 'exportsmith[onnx]'"

# ONNX Runtime's float32 CPU kernels (MatMul, Softmax, the fused ops onnxscript's optimizer emits) accumulate in
# another order than torch's, so outputs differ at rounding level (~1e-6 on the tiny models); a wrong mask, branch or
# cache slice moves logits by 1e-2 or more.
ONNX_MAX_ABS_DIFF = 1e-4

FAILURE_KINDS = ("build", "onnx-export-error", "ort-error", "mismatch", "greedy-mismatch")

# How the top-level names of the forward's keywords and of its output read in the ONNX graph (the cache is `cache`
# in transformers 5.x, `past_key_values` in 4.x).
INPUT_NAMES = {"cache": "past", "past_key_values": "past"}
OUTPUT_NAMES = {"cache": "present", "past_key_values": "present"}

# The name of a model output that is a bare tensor (vocoders, codebooks, some vision towers), or the prefix of a
# tuple output's items.
ROOT_NAME = "output"

# ONNX ops that draw random numbers (a model that samples in its forward: vit_mae's masking noise, a VAE's sample):
# a mismatch of such a graph says so, since no seed makes ONNX Runtime draw torch's values
RANDOM_OPS = frozenset(
    {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial", "Bernoulli"}
)

ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")  # torch.onnx colours its error messages


class MissingOnnxDependencies(ImportError):
    """onnx, onnxscript or onnxruntime is not installed."""


@dataclass
class RuntimeResult:
    """The verdict on one model in a runtime (ONNX Runtime here, ExecuTorch in `executorch_check`); `failure` is one
    of the class's `kinds`, `message` says where and why."""

    runtime: ClassVar[str] = ""
    kinds: ClassVar[tuple[str, ...]] = ()

    model_type: str
    ok: bool = False
    cases: list[CaseRecord] = field(default_factory=list)
    export_seconds: dict[str, float] = field(default_factory=dict)  # by program: the time to build it for the runtime
    failure: str | None = None
    message: str = ""
    greedy: list[dict] = field(default_factory=list)  # an LM's greedy loops in the runtime (greedy.GreedyRecord)

    @property
    def max_diff(self) -> float | None:
        diffs = [case.max_diff for case in self.cases if case.max_diff is not None]
        return max(diffs) if diffs else None

    @property
    def summary(self) -> str:
        if not self.ok:
            return f"{self.model_type}: {self.runtime} FAIL {self.failure}: {self.message}"
        seconds = ", ".join(f"{program} {s:.1f}s" for program, s in self.export_seconds.items())
        loops = f", {len(self.greedy)} greedy loops as generate()" if self.greedy else ""
        return f"{self.model_type}: {self.runtime} ok max|diff|={self.max_diff:.3g} ({seconds}){loops}"

    def conclude(
        self, original, generated, runnables: dict, tolerance: float, error_kind: str, errors: Sequence[str] = ()
    ) -> "RuntimeResult":
        """The verdict once every case ran: a mismatch above `tolerance` first (a wrong result is worse than a
        refused input), then `errors` and the cases' errors as `error_kind`, then an LM's greedy loops driven by
        `runnables` (program name -> callable) of `generated`; ok otherwise."""
        mismatched = [r for r in self.cases if r.max_diff is not None and not r.max_diff <= tolerance]
        if mismatched:
            return self.fail(
                "mismatch", "; ".join(f"{r.program} {r.name}: max|diff|={r.max_diff:.3g}" for r in mismatched)
            )
        errors = [*errors, *(f"{r.program} {r.name}: {r.error}" for r in self.cases if r.error is not None)]
        if errors:
            return self.fail(error_kind, "; ".join(errors))
        loops = lm_greedy_loops(original, runnables, tolerance, generated)
        self.greedy = [asdict(loop) for loop in loops]
        failed = [loop for loop in loops if not loop.ok]
        if failed:
            return self.fail("greedy-mismatch", "; ".join(loop.describe() for loop in failed))
        self.ok = True
        return self

    def fail(self, kind: str, message: str) -> "RuntimeResult":
        if kind not in self.kinds:
            raise ValueError(f"unknown failure kind {kind!r}")
        self.ok, self.failure, self.message = False, kind, message
        return self


@dataclass
class OnnxResult(RuntimeResult):
    runtime: ClassVar[str] = "ONNX"
    kinds: ClassVar[tuple[str, ...]] = FAILURE_KINDS

    input_names: dict[str, list[str]] = field(default_factory=dict)
    output_names: dict[str, list[str]] = field(default_factory=dict)


def require_onnx_packages() -> None:
    """Raise MissingOnnxDependencies, naming the extra to install, unless all of ONNX_PACKAGES import."""
    missing = []
    for name in ONNX_PACKAGES:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise MissingOnnxDependencies(f"ONNX verification needs {', '.join(missing)}: {INSTALL_HINT}")


def verify_onnx(model_type: str, package: str = "generated") -> OnnxResult:
    """Verify `<package>.<module>`'s model class of `model_type` through ONNX and ORT; raises only if deps miss."""
    require_onnx_packages()
    from onnx_ir.traversal import RecursiveGraphIterator  # torch.onnx's graph library, with the extra

    result = OnnxResult(model_type)
    try:
        original, generated = build_pair(model_type, package)
        references = original_references(original, programs_for(original))
        # the same cases, with the generated copy's own cache (its layer classes are its own), as `verify` does
        programs = in_range(programs_for(original, cache_model=generated), references)
    except Exception as error:
        return result.fail("build", first_line(error))

    export_errors, session_errors, sessions, random_ops = [], [], {}, set()
    for program in programs:
        example = program.cases[0]
        try:
            started = time.perf_counter()
            onnx_program = export_onnx(generated, example.inputs(), varying_dims(program))
            result.export_seconds[program.name] = time.perf_counter() - started
            name_graph_io(onnx_program, generated, example)
        except Exception as error:
            export_errors.append(f"{program.name}: {error_summary(error)}")
            continue
        graph = onnx_program.model.graph
        random_ops.update(node.op_type for node in RecursiveGraphIterator(graph) if node.op_type in RANDOM_OPS)
        result.input_names[program.name] = [value.name for value in graph.inputs]
        result.output_names[program.name] = [value.name for value in graph.outputs]
        try:
            session = ort_session(onnx_program)
        except Exception as error:
            session_errors.append(f"{program.name}: {first_line(error)}")
            continue
        sessions[program.name] = OrtProgram(session, onnx_program, run(generated, example))
        result.cases += [
            run_case(session, program.name, case, references[program.name, case.name]) for case in program.cases
        ]

    if export_errors:
        return result.fail("onnx-export-error", "; ".join(export_errors))
    result.conclude(original, generated, sessions, ONNX_MAX_ABS_DIFF, "ort-error", session_errors)
    if result.failure == "mismatch" and random_ops:
        result.message += (
            f" (the graph samples random numbers, {', '.join(sorted(random_ops))}: ONNX Runtime's generator does not"
            " draw torch's values)"
        )
    return result


class OrtProgram:
    """A program's ONNX Runtime session called as the program is: keyword inputs (a cache object among them) in, the
    model's output out, rebuilt from the session's outputs with the exported program's output tree spec (leaves the
    program returns as constants come from the spec, int leaves back as ints), so that its cache feeds the next step.
    """

    def __init__(self, session, onnx_program, example_output):
        program = onnx_program.exported_program
        self.session, self.out_spec = session, program.call_spec.out_spec
        outputs = [s for s in program.graph_signature.output_specs if s.kind == OutputKind.USER_OUTPUT]
        self.constants = {i: s.arg.value for i, s in enumerate(outputs) if isinstance(s.arg, ConstantArgument)}
        self.kinds = [type(leaf) for leaf in pytree.tree_leaves(example_output)]

    def __call__(self, **inputs):
        named = named_leaves(inputs, INPUT_NAMES)
        feed = {value.name: np.asarray(named[value.name]) for value in self.session.get_inputs()}
        values = iter(self.session.run(None, feed))
        leaves = []
        for index, kind in enumerate(self.kinds):
            if index in self.constants:
                leaves.append(self.constants[index])
            elif kind in (int, bool):
                leaves.append(kind(next(values)))
            else:
                leaves.append(torch.from_numpy(np.ascontiguousarray(next(values))))
        return pytree.tree_unflatten(leaves, self.out_spec)


def original_references(original: torch.nn.Module, programs: list[Program]) -> dict[tuple[str, str], dict]:
    """The original's eager outputs by readable name, at every (program, case); raises naming the case that failed."""
    references = {}
    for program in programs:
        for case in program.cases:
            try:
                output = run(original, case)
            except Exception as error:
                if case.optional:  # outside the model's range, as verify leaves it out
                    continue
                raise RuntimeError(f"original eager, {program.name} {case.name}: {first_line(error)}") from error
            references[program.name, case.name] = named_leaves(output, output_names(case.inputs()))
    return references


def error_summary(error: BaseException) -> str:
    """The first lines of `error` and of each error that caused it, outermost first: torch.onnx wraps the real error
    in generic ones (`Failed to convert the exported program to an ONNX model. This is step 3/3 ...`)."""
    lines = []
    while error is not None:
        lines.append(ANSI_ESCAPE.sub("", first_line(error)))
        error = error.__cause__
    return " <- ".join(lines)


@contextmanager
def quiet_onnx_registry():
    """Silence the exporter's per-export `torchvision is not installed. Skipping torchvision::nms` warnings."""
    registry_logger = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = registry_logger.level
    registry_logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        registry_logger.setLevel(level)


def one_sdpa_kernel():
    """A context in which every trace of an export sees the same SDPA kernel, the math one. On the CPU, SDPA picks
    flash or math by, among other things, whether its mask requires grad, and the two return different layouts;
    torch.onnx traces a program three times, with and without grad, so with a mask computed from a parameter (t5's
    position bias) the traces disagree and a view of the output fails (`Cannot view a tensor`: t5 and about 20 other
    types, docs/INTEROP.md). ExecuTorch's lowering re-traces the same way (gpt2). Within the program SDPA becomes the
    same matmuls and softmax either way (llama's ONNX graph: the same ops, a few shape ops fewer)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(SDPBackend.MATH)


class NumbersAsTensors(torch.nn.Module):
    """`model`, returning each Python number of its output as a 0-d tensor. torch.onnx cannot return a constant
    (`AttributeError: 'int' object has no attribute 'name'` in `_handle_output_node`): maskformer-swin's spatial
    dimensions, the window sizes in voxtral_realtime's and unlimited_ocr's caches. Numbers that vary are SymInts
    while tracing and stay as they are; `OrtProgram` gives int leaves back as ints."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model
        self.train(model.training)

    def forward(self, **inputs):
        output = self.model(**inputs)
        return pytree.tree_map(lambda leaf: torch.tensor(leaf) if type(leaf) in (int, float, bool) else leaf, output)


# onnxscript's optimizer replaces `x + c`, `x - c` by `x` when c is within these of 0, and `x * c`, `x / c` when c is
# within them of 1 (its rewriter's scalar-constant patterns, `onnxscript/rewriter/_pattern_ir.py`, `Constant`)
NO_OP_REL_TOL, NO_OP_ABS_TOL = 1e-5, 1e-8
NO_OP_IDENTITIES = {"Add": 0.0, "Sub": 0.0, "Mul": 1.0, "Div": 1.0}


def _scalar_constant(value) -> float | None:
    """The value of a one-element constant (an initializer or a `Constant` node's output), else None."""
    if value is None:
        return None
    tensor = value.const_value
    producer = value.producer()
    if tensor is None and producer is not None and producer.op_type == "Constant" and "value" in producer.attributes:
        tensor = producer.attributes["value"].value
    if tensor is None:
        return None
    array = tensor.numpy()
    return float(array.item()) if array.size == 1 and array.dtype.kind in "fiu" else None


def no_op_hazards(model) -> list[str]:
    """The scalar constants of an unoptimized ONNX graph that onnxscript's optimizer would take for the identity of
    their op though they are not: `x + 1e-8` becomes `x`, which drops the epsilon of muse_spark's post-expert RMSNorm
    (`post_norm_eps` 1e-8): rows of the size of the epsilon then normalize differently (max|diff| 1.46 in ONNX
    Runtime). A silent wrong result, not an error."""
    from onnx_ir.traversal import RecursiveGraphIterator

    found = []
    for node in RecursiveGraphIterator(model.graph):
        identity = NO_OP_IDENTITIES.get(node.op_type)
        if identity is None or node.domain not in ("", "ai.onnx"):
            continue
        operands = node.inputs if node.op_type in ("Add", "Mul") else node.inputs[1:]
        for value in operands:
            constant = _scalar_constant(value)
            if constant is not None and constant != identity:
                if math.isclose(constant, identity, rel_tol=NO_OP_REL_TOL, abs_tol=NO_OP_ABS_TOL):
                    found.append(f"{node.op_type} {constant!r}")
    return sorted(set(found))


def export_onnx(model: torch.nn.Module, example: dict, dynamic_shapes: dict) -> "torch.onnx.ONNXProgram":
    """`model` at `example` through `torch.onnx.export(dynamo=True)`, with check's dynamic dims and the translations
    of `onnx_translations` (transformers' MoE `grouped_mm_fallback`), SDPA on its math kernel (`one_sdpa_kernel`),
    and the output's constant numbers as tensors (`NumbersAsTensors`). The graph is optimized as torch.onnx does
    unless the optimizer would drop a constant that is not its op's identity (`no_op_hazards`), or leaves the graph
    invalid (`undefined_values`): it is then exported again and left as translated, and ONNX Runtime optimizes it
    when it loads it (the graph is not cloned before optimizing: a real-size model's would copy its weights). An
    input the graph returns as it is gets an output of its own (`outputs_apart_from_inputs`)."""
    from exportsmith.verify.onnx_translations import translation_table  # needs onnxscript: the `onnx` extra

    def translated() -> "torch.onnx.ONNXProgram":
        with quiet_onnx_registry(), one_sdpa_kernel():
            return torch.onnx.export(
                with_named_inputs(NumbersAsTensors(model), example),
                (),
                kwargs=example,
                dynamo=True,
                dynamic_shapes=dynamic_shapes,
                custom_translation_table=translation_table(),
                optimize=False,
                verbose=False,
                report=False,
            )

    program = translated()
    if not no_op_hazards(program.model):
        program.optimize()  # what `optimize=True` does
        if undefined_values(program.model):  # the optimizer broke the graph (rare: gemma4_audio's)
            program = translated()
    outputs_apart_from_inputs(program.model.graph)
    return program


def outputs_apart_from_inputs(graph) -> None:
    """An input the graph returns as it is (a cache layer's tensor that a step leaves unchanged) becomes an `Identity`
    of it: an ONNX value has one name, and the output's name is not the input's."""
    import onnx_ir  # torch.onnx's graph library, with the extra

    for index, value in enumerate(graph.outputs):
        if value.is_graph_input():
            identity = onnx_ir.node("Identity", inputs=[value])
            graph.append(identity)
            graph.outputs[index] = identity.outputs[0]


def undefined_values(model) -> list[str]:
    """The node inputs that nothing defines (no node's output, graph input or initializer): an invalid graph, which
    onnxscript's optimizer made of gemma4_audio's (ONNX Runtime: `Node input 'mul_145_min_1' is not a graph input,
    initializer, or output of a previous node`; the graph as translated loads)."""
    from onnx_ir.traversal import RecursiveGraphIterator

    return sorted(
        {
            value.name
            for node in RecursiveGraphIterator(model.graph)
            for value in node.inputs
            if value is not None
            and value.producer() is None
            and not value.is_graph_input()
            and not value.is_initializer()
        }
    )


def readable_name(path: pytree.KeyPath, top_level: dict[str, str]) -> str:
    """`['cache'].layers[0].keys` -> `past.layers.0.keys` (with top_level {"cache": "past"}).

    A path that starts without a name (the empty path of a bare tensor output, or the index of a tuple's item) is
    named under ROOT_NAME: `output`, `output.0`, ...
    """
    parts = [] if path and isinstance(path[0], (pytree.MappingKey, pytree.GetAttrKey)) else [ROOT_NAME]
    for key in path:
        if isinstance(key, pytree.MappingKey):
            parts.append(str(key.key))
        elif isinstance(key, pytree.SequenceKey):
            parts.append(str(key.idx))
        elif isinstance(key, pytree.GetAttrKey):
            parts.append(key.name)
        else:
            parts.append(str(key))
    parts[0] = top_level.get(parts[0], parts[0])
    return ".".join(parts)


def named_leaves(tree, top_level: dict[str, str]) -> dict:
    """Every leaf of `tree` (tensors, ints, bools) by its readable name. A None is no value: an ONNX graph has no
    input or output for it (pe_audio's text encoder returns `hidden_states` (None, None, tensor))."""
    return {
        readable_name(path, top_level): leaf
        for path, leaf in pytree.tree_flatten_with_path(tree)[0]
        if leaf is not None
    }


def output_names(inputs: dict) -> dict[str, str]:
    """The top-level renames of a call's output: OUTPUT_NAMES, and `output.<key>` for an output field that has the
    name of one of the call's inputs (gemma3n's audio encoder returns the `audio_mel_mask` it takes, downsampled;
    qwen2_audio an `attention_mask`): an ONNX graph names each value once."""
    return {**{name: f"{ROOT_NAME}.{name}" for name in inputs}, **OUTPUT_NAMES}


def name_graph_io(onnx_program, generated: torch.nn.Module, example: Case) -> None:
    """Rename the ONNX graph's inputs and outputs after the key paths of the traced call's inputs and output.

    The exported program's in/out tree specs fix the order of the flat leaves; leaves the program holds as
    constants (`use_cache=True`) are not graph inputs. Refuses (RuntimeError) a graph whose leaves do not line up.
    """
    program = onnx_program.exported_program
    kwargs_spec = program.call_spec.in_spec.child(1)  # the call is (args=(), kwargs)
    kwargs = example.inputs()
    kwargs = {name: kwargs[name] for name in kwargs_spec.context}
    output = run(generated, example)  # fresh inputs: the forward grows the cache it is given in place
    graph = onnx_program.model.graph
    for values, tree, spec, specs, top_level in (
        (graph.inputs, kwargs, kwargs_spec, program.graph_signature.input_specs, INPUT_NAMES),
        (
            graph.outputs,
            output,
            program.call_spec.out_spec,
            program.graph_signature.output_specs,
            output_names(kwargs),
        ),
    ):
        leaves, traced_spec = pytree.tree_flatten_with_path(tree)
        if traced_spec != spec:
            raise RuntimeError("the traced call's inputs or output do not match the exported program's tree spec")
        user_specs = [s for s in specs if s.kind in (InputKind.USER_INPUT, OutputKind.USER_OUTPUT)]
        names = [
            readable_name(path, top_level)
            for (path, _), user_spec in zip(leaves, user_specs, strict=True)
            if not isinstance(user_spec.arg, ConstantArgument)
        ]
        if len(names) != len(values):
            raise RuntimeError(f"{len(values)} graph values for {len(names)} non-constant leaves: {names}")
        for value, name in zip(values, names):
            value.name = name


def ort_session(onnx_program) -> "onnxruntime.InferenceSession":
    import onnxruntime  # optional: the module imports without the extra

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3  # errors only: ORT warns about every initializer it prunes
    return onnxruntime.InferenceSession(
        onnx_program.model_proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def run_case(session, program: str, case: Case, expected: dict) -> CaseRecord:
    """Run `session` at `case`; record max |diff| to the original's eager output `expected`, or the error raised."""
    record = CaseRecord(program, case.name, case.batch, case.new_tokens, case.past)
    inputs = named_leaves(case.inputs(), INPUT_NAMES)
    try:
        feed = {graph_input.name: np.asarray(inputs[graph_input.name]) for graph_input in session.get_inputs()}
        actual = dict(zip((output.name for output in session.get_outputs()), session.run(None, feed)))
    except Exception as error:
        record.error = first_line(error)
        return record
    record.max_diff = max_abs_diff(expected, actual)
    return record


def max_abs_diff(expected: dict, actual: dict) -> float:
    """Largest |difference| over same-named outputs; inf if the names or a shape differ."""
    if set(expected) != set(actual):
        return math.inf
    diff = 0.0
    for name, value in expected.items():
        wanted = np.asarray(value.numpy() if isinstance(value, torch.Tensor) else value, dtype=np.float64)
        got = np.asarray(actual[name], dtype=np.float64)
        if wanted.shape != got.shape:
            return math.inf
        if wanted.size:
            diff = max(diff, tensor_diff(torch.from_numpy(wanted), torch.from_numpy(got)))
    return diff
