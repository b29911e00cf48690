"""A test in transformers' style for one PR of the upstream series: it fails before the patch and passes after it.

`export_test(model_type, codemod)` writes a standalone unittest module for transformers' repository
(`tests/exporters/test_<codemod>.py`, beside its own export tests): it builds the model type's tiny model (the
harness's configuration, written out as literals), registers its caches the way transformers' exporters do, exports
its program with torch.export (non-strict, every dim that differs between the test's inputs dynamic), and checks it
against eager at each of the other inputs, as exported (its guards are checked on every call: a guard that rejects a
valid input fails the test) and after a save and load. Two kinds:

- a decoder LM's decode step: a cache from an eager prefix, new tokens, the mask; the example has 3 new tokens after
  5 cached ones (batch 2), the checks the first step of a generation from a 1-token prompt, batch 4 and a long past;
- any other model's forward: its inputs at the harness's shapes (integer inputs written out as they are, float inputs
  drawn from a seeded generator), the first shape as the example.

`dtype` float16 runs the model and its float inputs in half precision (the fp16 paths the fp32 harness never takes);
`overrides` adds configuration keywords (the eager experts loop, which transformers' default `grouped_mm` skips);
`named_tokens` declares a decode step's new tokens `Dim("tokens", min=1, max=64)`, as users write them, where the
other dims are `Dim.AUTO` (which accepts guards that a named range fails: the chunked scans' padding); `prefill`
exports a decoder LM's prefill instead, its prompt length declared so (a prompt longer than the indexer's top-k).
"""

from __future__ import annotations

import black
import torch

from .verify.check import audio_layout, build_original, forward_program, programs_for
from .verify.inputs import cache_keyword
from .verify.tasks import vocab

# Integer inputs up to this many elements are written out as they are (token ids where images go, grids, masks)
LITERAL_ELEMENTS = 4096
HEADER = """# Copyright 2026 The HuggingFace Team. All rights reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""
COMMON = '''
import io
import unittest

from transformers import is_torch_available
from transformers.testing_utils import require_torch

if is_torch_available():
    import torch
    from torch.utils import _pytree as pytree

    from transformers.exporters.exporter_dynamo import register_cache_pytrees_for_model

    {imports}


CONFIG = {config}


def dynamic_shapes(example, others):
    """`Dim.AUTO` for every dim that differs between `example` and one of `others`, for every int (a cache's
    counters), static otherwise; a cache as the flat list of its leaves (transformers' exporters flatten it so)."""

    def dims(value, *alike):
        if isinstance(value, torch.Tensor):
            return {{i: torch.export.Dim.AUTO for i in range(value.dim()) if any(o.shape[i] != value.shape[i] for o in alike)}}
        return torch.export.Dim.AUTO if type(value) is int else None

    shapes = {{}}
    for name, value in example.items():
        if isinstance(value, (torch.Tensor, int, bool)) or value is None:
            shapes[name] = dims(value, *(other[name] for other in others))
        else:
            leaves = [pytree.tree_leaves(other[name]) for other in others]
            shapes[name] = [dims(leaf, *alike) for leaf, *alike in zip(pytree.tree_leaves(value), *leaves)]
    return shapes


def saved_and_loaded(program):
    """The program after `torch.export.save` and `torch.export.load`, as a user ships it: its graph and weights, not
    its example inputs (those would be unpickled, and a cache is not among `torch.load`'s weights-only globals)."""
    program.example_inputs = None
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    buffer.seek(0)
    return torch.export.load(buffer)


def assert_outputs_close(test, actual, expected, tolerance):
    actual, expected = pytree.tree_leaves(actual), pytree.tree_leaves(expected)
    test.assertEqual(len(actual), len(expected))
    for got, want in zip(actual, expected):
        if isinstance(want, torch.Tensor):
            torch.testing.assert_close(got, want, atol=tolerance, rtol=tolerance)
'''
# Not formatted (single braces): appended to a decode test that declares named new tokens
NAMED_TOKENS = '''

def with_named_tokens(shapes):
    """`shapes` with the new tokens declared as users declare them, `Dim("tokens", min=1, max=64)`: a guard that
    `Dim.AUTO` would accept must then hold over the whole range."""
    shapes["input_ids"] = {**shapes["input_ids"], 1: torch.export.Dim("tokens", min=1, max=64)}
    return shapes
'''
DECODE = '''

def decode_inputs(model, batch, new_tokens, past, seed):
    """A decode step: `new_tokens` ids after a cache of `past` tokens that an eager forward produced."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, VOCAB_SIZE, (batch, past + new_tokens), generator=generator)
    with torch.no_grad():
        outputs = model(input_ids=ids[:, :past], use_cache=True)
    cache = outputs.cache if "cache" in outputs else outputs.past_key_values
    mask = torch.ones(batch, past + new_tokens, dtype=torch.long)
    return {{"input_ids": ids[:, past:], "attention_mask": mask, "{cache_keyword}": cache}}


VOCAB_SIZE = {vocab_size}


@require_torch
class {test_class}(unittest.TestCase):
    def test_{test_name}(self):
        """{docstring}"""
        torch.manual_seed(0)
        model = {model_class}({config_class}(**CONFIG)).eval(){to_dtype}
        register_cache_pytrees_for_model(model)
        # (batch, new tokens, past): the first step of a generation from a 1-token prompt, batch 4, a long past
        shapes = [(2, 3, 5), (1, 1, 1), (4, 1, 9), (1, 6, 11)]
        inputs = [decode_inputs(model, *shape, seed=seed) for seed, shape in enumerate(shapes)]
        # contiguous example tensors: the program then guards on no strides (a sliced cache is a view)
        example = pytree.tree_map_only(torch.Tensor, torch.Tensor.contiguous, inputs[0])
        program = torch.export.export(model, (), example, dynamic_shapes={shapes}, strict=False)
        # the program as exported (a guard that rejects a valid input fails the test), then as a user ships it, saved
        # and loaded (second: a program whose example inputs are cleared checks no guards)
        for saved in (False, True):
            exported = saved_and_loaded(program) if saved else program
            for case in inputs[1:]:
                with torch.no_grad():  # eager grows the cache it is given: give it a copy
                    expected = model(**pytree.tree_map_only(torch.Tensor, torch.clone, case))
                    actual = exported.module()(**case)
                assert_outputs_close(self, actual.logits, expected.logits, {tolerance})
'''
PREFILL = '''

def prefill_inputs(batch, tokens, seed):
    """A prompt of `tokens` ids, as a generation starts."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, VOCAB_SIZE, (batch, tokens), generator=generator)
    return {{"input_ids": ids, "attention_mask": torch.ones(batch, tokens, dtype=torch.long)}}


VOCAB_SIZE = {vocab_size}


@require_torch
class {test_class}(unittest.TestCase):
    def test_{test_name}(self):
        """{docstring}"""
        torch.manual_seed(0)
        model = {model_class}({config_class}(**CONFIG)).eval(){to_dtype}
        register_cache_pytrees_for_model(model)
        # (batch, prompt length): a 1-token prompt, batch 4, a long prompt
        shapes = [(2, 5), (1, 1), (4, 3), (1, 12)]
        inputs = [prefill_inputs(*shape, seed=seed) for seed, shape in enumerate(shapes)]
        # the prompt length declared as users declare it: a guard that `Dim.AUTO` would accept must hold over the range
        tokens = torch.export.Dim("tokens", min=1, max=64)
        dims = {{name: {{0: torch.export.Dim.AUTO, 1: tokens}} for name in inputs[0]}}
        program = torch.export.export(model, (), inputs[0], dynamic_shapes=dims, strict=False)
        # the program as exported (a guard that rejects a valid input fails the test), then as a user ships it, saved
        # and loaded (second: a program whose example inputs are cleared checks no guards)
        for saved in (False, True):
            exported = saved_and_loaded(program) if saved else program
            for case in inputs[1:]:
                with torch.no_grad():
                    expected = model(**case)
                    actual = exported.module()(**case)
                assert_outputs_close(self, actual.logits, expected.logits, {tolerance})
'''
FORWARD = '''

INPUTS = [
{inputs}
]


@require_torch
class {test_class}(unittest.TestCase):
    def test_{test_name}(self):
        """{docstring}"""
        torch.manual_seed(0)
        model = {model_class}({config_class}(**CONFIG)).eval(){to_dtype}
        register_cache_pytrees_for_model(model)
        inputs = [build() for build in INPUTS]
        program = torch.export.export(
            model, (), inputs[0], dynamic_shapes=dynamic_shapes(inputs[0], inputs[1:]), strict=False
        )
        # the program as exported (a guard that rejects a valid input fails the test), then as a user ships it, saved
        # and loaded (second: a program whose example inputs are cleared checks no guards)
        for saved in (False, True):
            exported = saved_and_loaded(program) if saved else program
            for case in inputs[1:]:
                with torch.no_grad():
                    expected = model(**case)
                    actual = exported.module()(**case)
                assert_outputs_close(self, actual, expected, {tolerance})
'''


class NoTest(Exception):
    """The model's program takes inputs this generator cannot write out."""


def export_test(
    model_type: str,
    codemod: str,
    dtype: torch.dtype = torch.float32,
    overrides: dict | None = None,
    named_tokens: bool = False,
    prefill: bool = False,
) -> tuple[str, str]:
    """(path inside transformers' repository, text) of the test for `codemod`'s PR, on `model_type`; `overrides` are
    configuration keywords the test adds (`experts_implementation="eager"`: the path a default config does not take);
    `named_tokens`: a decode step declares its new tokens with a named dim (guards `Dim.AUTO` accepts fail it);
    `prefill`: a decoder LM's test exports its prefill instead, the prompt length a named dim.
    """
    original, config = build_original(model_type)
    model_class = type(original)
    snake = codemod.replace("-", "_")
    cache = cache_keyword(original)
    decoder_lm = cache is not None and not getattr(config, "is_encoder_decoder", False)
    decoder_lm = decoder_lm and programs_for(original)[0].name == "decode"
    half = dtype == torch.float16
    fields = {
        "imports": _imports(type(config), model_class),
        "config_class": type(config).__name__,
        "model_class": model_class.__name__,
        "config": repr({**_config_literal(config), **(overrides or {})}),
        "test_class": f"{model_class.__name__}{''.join(p.title() for p in snake.split('_'))}ExportTest",
        "to_dtype": ".half()" if half else "",
        "tolerance": "1e-2" if half else "1e-4",
    }
    if decoder_lm:
        fields.update(
            test_name="decode_step_exports_and_matches_eager_at_other_shapes",
            docstring=f"The decode step's program serves other batches, new tokens and cache lengths ({codemod}).",
            cache_keyword=cache,
            vocab_size=vocab(config),
            shapes="dynamic_shapes(example, inputs[1:])",
        )
        if prefill:
            fields.update(
                test_name="prefill_exports_and_matches_eager_at_other_prompt_lengths",
                docstring=f"The prefill's program serves other batches and prompt lengths ({codemod}).",
            )
            body = PREFILL.format(**fields)
        else:
            if named_tokens:
                fields["shapes"] = f"with_named_tokens({fields['shapes']})"
            body = (NAMED_TOKENS if named_tokens else "") + DECODE.format(**fields)
    elif named_tokens or prefill:
        raise NoTest("named new tokens and a prefill are written for a decoder LM only")
    else:
        program = forward_program(original, audio_layout(original))
        cases = [case.inputs() for case in program.cases if not case.optional]
        fields.update(
            test_name="forward_exports_and_matches_eager_at_other_shapes",
            docstring=f"The forward's program serves other batches and sizes ({codemod}).",
            inputs="\n".join(f"    lambda: {_literal(case, dtype, seed)}," for seed, case in enumerate(cases)),
        )
        body = FORWARD.format(**fields)
    text = HEADER + f'"""torch.export of {model_class.__name__}: {codemod}."""\n' + COMMON.format(**fields) + body
    return f"tests/exporters/test_{snake}.py", black.format_str(text, mode=black.Mode(line_length=119))


def _imports(*classes: type) -> str:
    """`from transformers import A, B` for classes transformers exports at its top level, else from their modules."""
    import transformers

    modules: dict[str, list[str]] = {}
    for cls in classes:
        module = "transformers" if getattr(transformers, cls.__name__, None) is cls else cls.__module__
        modules.setdefault(module, []).append(cls.__name__)
    return "\n    ".join(f"from {module} import {', '.join(names)}" for module, names in modules.items())


def _config_literal(config) -> dict:
    data = config.to_diff_dict()
    data.pop("transformers_version", None)
    return data


def _literal(value, dtype: torch.dtype, seed: int) -> str:
    """Python source that builds `value` (forward kwargs): integer tensors as written, float ones drawn seeded."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key!r}: {_literal(item, dtype, seed)}" for key, item in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        items = ", ".join(_literal(item, dtype, seed) for item in value)
        return f"[{items}]" if isinstance(value, list) else f"({items},)"
    if value is None or isinstance(value, (bool, int, float, str)):
        return repr(value)
    if not isinstance(value, torch.Tensor):
        raise NoTest(f"an input of type {type(value).__name__}")
    if value.is_floating_point():
        target = dtype if dtype == torch.float16 else value.dtype
        draw = "rand" if value.numel() and 0 <= float(value.min()) and float(value.max()) <= 1 else "randn"
        shape = tuple(value.shape)
        return f"torch.{draw}({shape}, generator=torch.Generator().manual_seed({seed}), dtype=torch.{str(target)[6:]})"
    if value.numel() > LITERAL_ELEMENTS:
        low, high = int(value.min()), int(value.max()) + 1
        return f"torch.randint({low}, {high}, {tuple(value.shape)}, generator=torch.Generator().manual_seed({seed}))"
    return f"torch.tensor({value.tolist()!r}, dtype=torch.{str(value.dtype)[6:]})"
