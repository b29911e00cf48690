"""Runtime tests of the cache pytree registration that `import generated` makes (`generated/_shared/cache_utils.py`,
rendered from `codemods/cache_pytree.py`'s MACHINERY).

What is checked, on transformers' own classes:
1. every cache layer and cache round-trips through `tree_flatten`/`tree_unflatten`, attribute by attribute, and its
   spec is stable and keyed by readable paths (`.layers[0].keys`);
2. specs survive `treespec_dumps`/`treespec_loads`;
3. a program taking and returning a `DynamicCache` exports, saves, and loads in a fresh process that imports
   `generated` (and only there), with no weights_only fallback;
4. registration is idempotent, and reuses (or clearly refuses) a registration made earlier by other code;
5. the committed `generated/` registers transformers' own classes, and a freshly generated model-local cache
   (`MiniMaxCache`) is registered too.

Everything that depends on import order runs in a fresh `python -c` subprocess with cwd=/work/main, so that
`import generated` finds the committed package.
"""

import copy
import inspect
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import transformers
from torch.export import Dim
from torch.utils import _pytree as pytree

import generated  # noqa: F401  (registers the cache pytree nodes)
from generated._shared import cache_utils as gen_cache_utils
from transformers import cache_utils as cu

REPO = Path(__file__).resolve().parents[1]
SUBPROCESS_TIMEOUT = 120


# ----------------------------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------------------------


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _kv(g, batch=2, heads=2, seq=3, dim=4):
    return torch.randn(batch, heads, seq, dim, generator=g), torch.randn(batch, heads, seq, dim, generator=g)


def _llama_config(num_layers=2):
    return transformers.LlamaConfig(
        num_hidden_layers=num_layers,
        hidden_size=16,
        intermediate_size=32,
        num_attention_heads=2,
        num_key_value_heads=2,
        vocab_size=32,
    )


def _sliding_config():
    """A decoder config whose `layer_types` mixes a sliding-window layer and a full-attention layer."""
    return transformers.Qwen2Config(
        num_hidden_layers=2,
        hidden_size=16,
        intermediate_size=32,
        num_attention_heads=2,
        num_key_value_heads=2,
        vocab_size=32,
        use_sliding_window=True,
        sliding_window=4,
        layer_types=["sliding_attention", "full_attention"],
    )


def run_python(code: str, *args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """Runs `code` with `python -c` in a fresh interpreter (cwd on sys.path, so `import generated` finds `cwd`)."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT,
    )


def last_json_line(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, f"subprocess failed:\n{proc.stdout}\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _is_cache_object(value) -> bool:
    return type(value) in gen_cache_utils._PYTREE_CACHE_CLASSES.values()


def assert_same(a, b, where="obj"):
    """Structural equality of two cache objects: same types, same attributes in the same order, tensors equal with
    the same dtype/device/shape, ints/flags/dict keys of the same Python type, classes identical; nested caches
    and layers must be distinct objects (the round trip builds new ones)."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        assert (a.dtype, a.device, a.shape) == (b.dtype, b.device, b.shape), f"{where}: tensor metadata differs"
        assert torch.equal(a, b), f"{where}: tensor values differ"
    elif _is_cache_object(a):
        assert a is not b, f"{where}: unflatten returned the original object instead of a new one"
        assert list(vars(a)) == list(vars(b)), f"{where}: attributes {list(vars(a))} != {list(vars(b))}"
        for name, value in vars(a).items():
            assert_same(value, vars(b)[name], f"{where}.{name}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{where}: length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, dict):
        assert [(type(k), k) for k in a] == [(type(k), k) for k in b], f"{where}: keys {list(a)} != {list(b)}"
        for k in a:
            assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, type):
        assert a is b, f"{where}: class {a} is not {b}"
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def clone_leaves(leaves):
    return [leaf.clone() if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]


# ----------------------------------------------------------------------------------------------------------------
# The objects under test: one builder per case, each building a fresh, seeded object
# ----------------------------------------------------------------------------------------------------------------


def _dynamic_layer():
    layer = cu.DynamicLayer()
    layer.update(*_kv(_gen()))
    return layer


def _sliding_layer(seq, record_past, window=4):
    def build():
        g = _gen()
        layer = cu.DynamicSlidingWindowLayer(sliding_window=window)
        if record_past:
            layer.activate_past_recording()
        layer.update(*_kv(g, seq=seq))
        layer.update(*_kv(g, seq=1))
        return layer

    return build


def _static_layer():
    layer = cu.StaticLayer(max_cache_len=8)
    layer.update(*_kv(_gen()))
    return layer


def _static_sliding_layer(seq):
    def build():
        g = _gen()
        layer = cu.StaticSlidingWindowLayer(max_cache_len=8, sliding_window=4)
        layer.update(*_kv(g, seq=seq))
        layer.update(*_kv(g, seq=1))
        return layer

    return build


def _dynamic_indexed_layer(with_positions):
    def build():
        g = _gen()
        layer = cu.DynamicIndexedLayer()
        layer.update(*_kv(g))
        layer.update_indexer(torch.randn(2, 3, 5, generator=g))
        if with_positions:
            layer.indexer_position_ids = torch.arange(3).expand(1, 2, 3).clone()
        return layer

    return build


def _static_indexed_layer():
    g = _gen()
    layer = cu.StaticIndexedLayer(max_cache_len=8)
    layer.update(*_kv(g))
    layer.update_indexer(torch.randn(2, 3, 5, generator=g))
    return layer


def _fill_linear_states(layer, g):
    """Conv + recurrent states for both of `number_of_states=2` states, then one decode step of conv state 0."""
    for state_idx in range(2):
        layer.update_conv_state(torch.randn(2, 6, 3 + state_idx, generator=g), state_idx=state_idx)
        layer.update_recurrent_state(torch.randn(2, 2, 4, 4, generator=g), state_idx=state_idx)
    layer.update_conv_state(torch.randn(2, 6, 1, generator=g), state_idx=0)


def _linear_layer():
    layer = cu.LinearAttentionLayer(number_of_states=2)
    _fill_linear_states(layer, _gen())
    return layer


def _hybrid_layer(cls, **kwargs):
    def build():
        g = _gen()
        layer = cls(number_of_states=2, **kwargs)
        _fill_linear_states(layer, g)
        layer.update(*_kv(g, seq=5))
        return layer

    return build


def _quantized_layer(cls):
    def build():
        try:
            layer = cls()
        except ImportError as e:  # quanto / hqq backends
            pytest.skip(f"{cls.__name__} needs an optional package: {e}")
        except TypeError as e:  # abstract: `_quantize`/`_dequantize` are left to the backends
            pytest.skip(f"{cls.__name__} cannot be instantiated: {e}")
        g = _gen()
        layer.update(*_kv(g))
        layer.update(*_kv(g, seq=1))
        return layer

    return build


def _dynamic_cache_filled():
    g = _gen()
    cache = cu.DynamicCache()
    for layer_idx in range(2):
        cache.update(*_kv(g), layer_idx)
    return cache


def _dynamic_cache_from_config(filled):
    def build():
        cache = cu.DynamicCache(config=_sliding_config())
        assert [type(layer) for layer in cache.layers] == [cu.DynamicSlidingWindowLayer, cu.DynamicLayer]
        if filled:
            g = _gen()
            for layer_idx in range(2):
                cache.update(*_kv(g, seq=5), layer_idx)
        return cache

    return build


def _static_cache():
    g = _gen()
    cache = cu.StaticCache(config=_sliding_config(), max_cache_len=8)
    for layer_idx in range(2):
        cache.update(*_kv(g, seq=5), layer_idx)
    return cache


def _encoder_decoder_cache(is_updated):
    def build():
        g = _gen()
        self_attention = cu.DynamicCache(config=_llama_config())
        cross_attention = cu.DynamicCache(config=_llama_config())
        for layer_idx in range(2):
            self_attention.update(*_kv(g), layer_idx)
            if is_updated:
                cross_attention.update(*_kv(g, seq=6), layer_idx)
        cache = cu.EncoderDecoderCache(self_attention, cross_attention)
        assert cache.is_updated == {0: is_updated, 1: is_updated}
        return cache

    return build


def _mtp_cache():
    g = _gen()
    cache = cu.MtpCache()
    cache.update(*_kv(g), 0)
    return cache


def _dflash_cache():
    g = _gen()
    cache = cu.DFlashCache()
    cache.update(*_kv(g), 0)
    cache.set_previous_accepted_tokens(2)
    return cache


def _quantized_cache_fp8():
    g = _gen()
    cache = cu.QuantizedCache(backend="fp8", config=_llama_config())
    for _ in range(2):
        cache.update(*_kv(g), 0)
    return cache


LAYER_CASES = {
    "DynamicLayer-empty": cu.DynamicLayer,
    "DynamicLayer": _dynamic_layer,
    "DynamicSlidingWindowLayer-empty": lambda: cu.DynamicSlidingWindowLayer(sliding_window=4),
    "DynamicSlidingWindowLayer-below-window": _sliding_layer(seq=1, record_past=False),
    "DynamicSlidingWindowLayer-beyond-window": _sliding_layer(seq=6, record_past=False),
    "DynamicSlidingWindowLayer-below-window-record-past": _sliding_layer(seq=1, record_past=True),
    "DynamicSlidingWindowLayer-beyond-window-record-past": _sliding_layer(seq=6, record_past=True),
    "StaticLayer-empty": lambda: cu.StaticLayer(max_cache_len=8),
    "StaticLayer": _static_layer,
    "StaticSlidingWindowLayer-below-window": _static_sliding_layer(seq=2),
    "StaticSlidingWindowLayer-beyond-window": _static_sliding_layer(seq=6),
    "DynamicIndexedLayer-empty": cu.DynamicIndexedLayer,
    "DynamicIndexedLayer": _dynamic_indexed_layer(with_positions=False),
    "DynamicIndexedLayer-position-ids": _dynamic_indexed_layer(with_positions=True),
    "StaticIndexedLayer": _static_indexed_layer,
    "LinearAttentionLayer-empty": lambda: cu.LinearAttentionLayer(number_of_states=2),
    "LinearAttentionLayer": _linear_layer,
    "LinearAttentionAndFullAttentionLayer": _hybrid_layer(cu.LinearAttentionAndFullAttentionLayer),
    "LinearAttentionAndSlidingWindowAttentionLayer": _hybrid_layer(
        cu.LinearAttentionAndSlidingWindowAttentionLayer, sliding_window=4
    ),
    "LinearAttentionAndStaticFullAttentionLayer": _hybrid_layer(
        cu.LinearAttentionAndStaticFullAttentionLayer, max_cache_len=8
    ),
    "LinearAttentionAndStaticSlidingWindowAttentionLayer": _hybrid_layer(
        cu.LinearAttentionAndStaticSlidingWindowAttentionLayer, max_cache_len=8, sliding_window=4
    ),
    "DummyLayer": cu.DummyLayer,
    "QuantizedLayer": _quantized_layer(cu.QuantizedLayer),
    "QuantoQuantizedLayer": _quantized_layer(cu.QuantoQuantizedLayer),
    "HQQQuantizedLayer": _quantized_layer(cu.HQQQuantizedLayer),
    "Fp8QuantizedLayer": _quantized_layer(cu.Fp8QuantizedLayer),
}

CACHE_CASES = {
    "DynamicCache-empty-lazy": cu.DynamicCache,
    "DynamicCache-config-sliding+full": _dynamic_cache_from_config(filled=False),
    "DynamicCache-config-sliding+full-filled": _dynamic_cache_from_config(filled=True),
    "DynamicCache-filled-by-update": _dynamic_cache_filled,
    "StaticCache": _static_cache,
    "EncoderDecoderCache-is_updated-True": _encoder_decoder_cache(is_updated=True),
    "EncoderDecoderCache-is_updated-False": _encoder_decoder_cache(is_updated=False),
    "MtpCache": _mtp_cache,
    "DFlashCache": _dflash_cache,
    "QuantizedCache-fp8": _quantized_cache_fp8,
}

ALL_CASES = {**LAYER_CASES, **CACHE_CASES}


# ----------------------------------------------------------------------------------------------------------------
# 1. Round trip of every layer and cache type
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", list(ALL_CASES))
def test_round_trip_gives_an_equal_object_and_the_same_spec(case):
    obj = ALL_CASES[case]()
    assert type(obj) in pytree.SUPPORTED_NODES, f"{type(obj).__name__} is not a registered pytree node"

    leaves, spec = pytree.tree_flatten(obj)
    assert not any(_is_cache_object(leaf) for leaf in leaves), "a cache object was left as a leaf"
    rebuilt = pytree.tree_unflatten(clone_leaves(leaves), spec)

    assert type(rebuilt) is type(obj)
    assert_same(obj, rebuilt)
    leaves_again, spec_again = pytree.tree_flatten(rebuilt)
    assert spec_again == spec
    assert pytree.treespec_dumps(spec_again) == pytree.treespec_dumps(spec)
    assert len(leaves_again) == len(leaves)
    for before, after in zip(leaves, leaves_again):
        assert type(before) is type(after)
        assert torch.equal(before, after) if isinstance(before, torch.Tensor) else before == after


@pytest.mark.parametrize("case", list(ALL_CASES))
def test_spec_survives_json_serialization(case):
    obj = ALL_CASES[case]()
    leaves, spec = pytree.tree_flatten(obj)
    loaded = pytree.treespec_loads(pytree.treespec_dumps(spec))
    assert loaded == spec
    assert_same(obj, pytree.tree_unflatten(clone_leaves(leaves), loaded))


PATH_PATTERN = re.compile(r"(\.[A-Za-z_]\w*|\[\d+\])+")


@pytest.mark.parametrize("case", list(ALL_CASES))
def test_leaf_paths_are_readable_attribute_paths(case):
    obj = ALL_CASES[case]()
    paths = [pytree.keystr(path) for path, _ in pytree.tree_flatten_with_path(obj)[0]]
    assert len(paths) == len(pytree.tree_leaves(obj))
    for path in paths:
        assert PATH_PATTERN.fullmatch(path), f"unreadable leaf path {path!r}"
    assert len(set(paths)) == len(paths)


def test_leaf_paths_name_the_attributes():
    def paths(obj):
        return [pytree.keystr(path) for path, _ in pytree.tree_flatten_with_path(obj)[0]]

    assert paths(_dynamic_cache_filled()) == [
        ".layers[0].keys",
        ".layers[0].values",
        ".layers[1].keys",
        ".layers[1].values",
    ]
    # The window size is fixed: it lives in the context. The counter changes every call: it is a (dynamic) leaf.
    assert paths(_dynamic_cache_from_config(filled=True)())[:5] == [
        ".layers[0].keys",
        ".layers[0].values",
        ".layers[0].cumulative_length",
        ".layers[0]._sliding_window_tensor",
        ".layers[1].keys",
    ]
    assert paths(_encoder_decoder_cache(is_updated=True)())[0] == ".self_attention_cache.layers[0].keys"
    assert paths(_encoder_decoder_cache(is_updated=True)())[-1] == ".cross_attention_cache.layers[1].values"
    linear = paths(_linear_layer())
    assert {".conv_states[0]", ".conv_states[1]", ".recurrent_states[0]", ".recurrent_states[1]"} <= set(linear)
    assert paths(cu.DummyLayer()) == []


@pytest.mark.parametrize("case", list(CACHE_CASES))
def test_round_tripped_cache_behaves_like_the_original(case):
    original = CACHE_CASES[case]()
    leaves, spec = pytree.tree_flatten(original)
    rebuilt = pytree.tree_unflatten(clone_leaves(leaves), spec)
    assert rebuilt.get_seq_length() == original.get_seq_length()
    assert rebuilt.is_sliding == original.is_sliding
    if isinstance(original, cu.EncoderDecoderCache):
        # it has no `layers` of its own (so no `update`, nor a working `is_initialized`): check its parts
        assert rebuilt.cross_attention_cache.get_seq_length() == original.cross_attention_cache.get_seq_length()
        assert rebuilt.is_updated == original.is_updated
        return
    assert rebuilt.is_initialized == original.is_initialized
    new_k, new_v = _kv(_gen(1))
    expected = copy.deepcopy(original).update(new_k, new_v, 0)
    got = rebuilt.update(new_k, new_v, 0)
    for want, have in zip(expected, got):
        assert torch.equal(want, have)


def test_round_trip_does_not_share_mutable_state_with_the_original():
    original = _encoder_decoder_cache(is_updated=False)()
    leaves, spec = pytree.tree_flatten(original)
    rebuilt = pytree.tree_unflatten(leaves, spec)
    rebuilt.is_updated[0] = True
    rebuilt.self_attention_cache.layers.append(cu.DynamicLayer())
    assert original.is_updated == {0: False, 1: False}
    assert len(original.self_attention_cache.layers) == 2


# ----------------------------------------------------------------------------------------------------------------
# 2. Serialization of the spec
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "build",
    [_dynamic_cache_filled, cu.DynamicCache, _encoder_decoder_cache(True), _encoder_decoder_cache(False)],
    ids=["DynamicCache", "DynamicCache-empty", "EncoderDecoderCache-updated", "EncoderDecoderCache-not-updated"],
)
def test_treespec_dumps_loads_round_trips(build):
    obj = build()
    _, spec = pytree.tree_flatten(obj)
    dumped = pytree.treespec_dumps(spec)
    loaded = pytree.treespec_loads(dumped)
    assert loaded == spec
    assert pytree.treespec_dumps(loaded) == dumped
    assert type(obj).__name__ in dumped  # serialized under its own name...
    assert f"{type(obj).__module__}.{type(obj).__qualname__}" in dumped  # ...which is `module.qualname`


def test_treespecs_of_differently_updated_encoder_decoder_caches_differ():
    # `is_updated` is structure (the program branches on it), so it is part of the spec and survives serialization
    _, updated = pytree.tree_flatten(_encoder_decoder_cache(True)())
    _, not_updated = pytree.tree_flatten(_encoder_decoder_cache(False)())
    assert pytree.treespec_loads(pytree.treespec_dumps(updated)) != pytree.treespec_loads(
        pytree.treespec_dumps(not_updated)
    )


# ----------------------------------------------------------------------------------------------------------------
# 3. Export, save, and load in a fresh process
# ----------------------------------------------------------------------------------------------------------------


class UpdateCache(torch.nn.Module):
    """Appends the new states to every layer, returns the sum of the keys and the updated cache."""

    def forward(self, key_states, value_states, cache):
        total = key_states.new_zeros(())
        for layer_idx in range(len(cache.layers)):
            keys, _ = cache.update(key_states, value_states, layer_idx)
            total = total + keys.sum()
        return total, cache


def _export_cache(kind, batch, past, seed):
    g = _gen(seed)
    cache = cu.DynamicCache(config=_sliding_config()) if kind == "sliding+full" else cu.DynamicCache()
    if kind == "sliding+full":
        cache.layers[0].sliding_window = 8  # stays below the window: past up to 6, plus one new token
    for layer_idx in range(2):
        cache.update(*_kv(g, batch=batch, seq=past), layer_idx)
    return (*_kv(g, batch=batch, seq=1), cache)


def dynamic_shapes_for(value, batch, past):
    """Mirrors `value`'s pytree: batch and past dims of 4-d tensors DYNAMIC, Python ints AUTO. A registered node
    gives the list of its flatten's children, as torch.export expects."""
    if isinstance(value, torch.Tensor):
        return {0: batch, 2: past} if value.dim() == 4 else None
    if isinstance(value, int) and not isinstance(value, bool):
        return Dim.AUTO
    if isinstance(value, (list, tuple)):
        return type(value)(dynamic_shapes_for(item, batch, past) for item in value)
    node = pytree.SUPPORTED_NODES.get(type(value))
    if node is None:
        return None
    children, _ = node.flatten_fn(value)
    return [dynamic_shapes_for(child, batch, past) for child in children]


LOAD_AND_RUN = """
    import sys
    import torch
    import generated
    from torch.utils import _pytree as pytree

    program, inputs, outputs = sys.argv[1:]
    ep = torch.export.load(program)
    data = torch.load(inputs, weights_only=True)
    args = pytree.tree_unflatten(data["leaves"], pytree.treespec_loads(data["spec"]))
    out = ep.module()(*args)
    leaves, spec = pytree.tree_flatten(out)
    torch.save({"leaves": leaves, "spec": pytree.treespec_dumps(spec)}, outputs)
    print("ran", type(out[1]).__name__)
"""

LOAD_ONLY = """
    import sys
    import torch

    torch.export.load(sys.argv[1])
"""


@pytest.fixture(scope="module", params=["full", "sliding+full"])
def saved_program(request, tmp_path_factory):
    kind = request.param
    args = _export_cache(kind, batch=2, past=3, seed=0)
    # the new states hold one token (a size-1 dim specialises): only their batch is dynamic
    dynamic_shapes = ({0: Dim.DYNAMIC}, {0: Dim.DYNAMIC}, dynamic_shapes_for(args[2], Dim.DYNAMIC, Dim.DYNAMIC))
    ep = torch.export.export(UpdateCache(), args, dynamic_shapes=dynamic_shapes, strict=False)
    path = tmp_path_factory.mktemp("program") / f"{kind.replace('+', '_')}.pt2"
    torch.export.save(ep, path)
    return kind, path


def test_saved_program_loads_and_runs_in_a_fresh_process_that_imports_generated(saved_program, tmp_path):
    kind, path = saved_program
    args = _export_cache(kind, batch=3, past=5, seed=1)  # another batch and past length than traced
    leaves, spec = pytree.tree_flatten(args)
    torch.save({"leaves": leaves, "spec": pytree.treespec_dumps(spec)}, tmp_path / "inputs.pt")

    expected = UpdateCache()(*pytree.tree_unflatten(clone_leaves(leaves), spec))
    proc = run_python(LOAD_AND_RUN, str(path), str(tmp_path / "inputs.pt"), str(tmp_path / "outputs.pt"))
    assert proc.returncode == 0, proc.stderr
    assert "ran DynamicCache" in proc.stdout
    assert "Fallback to weights_only=False" not in proc.stderr, proc.stderr
    assert "Weights only load failed" not in proc.stderr, proc.stderr

    got = torch.load(tmp_path / "outputs.pt", weights_only=True)
    expected_leaves, expected_spec = pytree.tree_flatten(expected)
    assert got["spec"] == pytree.treespec_dumps(expected_spec)
    assert len(got["leaves"]) == len(expected_leaves)
    for want, have in zip(expected_leaves, got["leaves"]):
        if isinstance(want, torch.Tensor):
            assert want.shape == have.shape and torch.equal(want, have)
        else:
            assert want == have
    assert expected[1].layers[1].keys.shape == (3, 2, 6, 4)  # the run really used the new past length


def test_saved_program_does_not_load_without_the_registration(saved_program):
    _, path = saved_program
    proc = run_python(LOAD_ONLY, str(path))
    assert proc.returncode != 0
    assert "transformers.cache_utils.DynamicCache in pytree is not registered" in proc.stderr, proc.stderr


# ----------------------------------------------------------------------------------------------------------------
# 4. Idempotence and interop with other registrations
# ----------------------------------------------------------------------------------------------------------------


def _registration_state(cls):
    return (
        pytree.SUPPORTED_NODES[cls],
        pytree.SUPPORTED_SERIALIZED_TYPES[cls],
        len(pytree.SUPPORTED_NODES),
        dict(gen_cache_utils._PYTREE_CACHE_CLASSES),
        set(torch.serialization.get_safe_globals()),
    )


def test_registering_again_is_a_no_op():
    before = _registration_state(cu.DynamicCache)
    gen_cache_utils.register_cache_pytree_node(cu.DynamicCache)
    after = _registration_state(cu.DynamicCache)
    assert after[0] is before[0] and after[1] is before[1]
    assert after[2:] == before[2:]
    for cls in list(gen_cache_utils._PYTREE_CACHE_CLASSES.values()):
        gen_cache_utils.register_cache_pytree_node(cls)
    assert _registration_state(cu.DynamicCache)[2:] == before[2:]
    # and the node still works
    assert_same(_dynamic_cache_filled(), pytree.tree_unflatten(*pytree.tree_flatten(_dynamic_cache_filled())))


def test_importing_generated_after_executorch_registration_reuses_it():
    proc = run_python("""
        import json
        import torch
        from torch.utils import _pytree as pytree
        from transformers.cache_utils import DynamicCache, DynamicLayer
        from transformers.integrations.executorch import register_dynamic_cache_export_support

        register_dynamic_cache_export_support()
        node, serialized = pytree.SUPPORTED_NODES[DynamicCache], pytree.SUPPORTED_SERIALIZED_TYPES[DynamicCache]
        count = len(pytree.SUPPORTED_NODES)
        import generated
        from generated._shared.cache_utils import register_cache_pytree_node, _PYTREE_CACHE_CLASSES
        from generated._shared.loading import Deferred
        from transformers.utils import ModelOutput

        register_cache_pytree_node(DynamicCache)
        print(json.dumps({
            "same_node": pytree.SUPPORTED_NODES[DynamicCache] is node,
            "same_serialized": pytree.SUPPORTED_SERIALIZED_TYPES[DynamicCache] is serialized,
            "flatten_module": pytree.SUPPORTED_NODES[DynamicCache].flatten_fn.__module__,
            "dynamic_cache_types": sum(1 for cls in pytree.SUPPORTED_NODES if cls is DynamicCache),
            "layer_registered_by_generated": pytree.SUPPORTED_NODES[DynamicLayer].flatten_fn.__module__,
            "known_to_generated": _PYTREE_CACHE_CLASSES.get("transformers.cache_utils.DynamicCache") is DynamicCache,
            # the nodes it added for caches: not its placeholders (`_shared/loading.py`), nor the ModelOutput classes
            # of the modules it imports
            "new_nodes": sum(
                1 for cls in list(pytree.SUPPORTED_NODES)[count:] if not issubclass(cls, (Deferred, ModelOutput))
            ),
        }))
        """)
    result = last_json_line(proc)
    assert result["same_node"] and result["same_serialized"]
    assert result["flatten_module"] == "transformers.integrations.executorch"
    assert result["dynamic_cache_types"] == 1
    assert result["layer_registered_by_generated"] == "generated._shared.cache_utils"
    assert result["known_to_generated"]
    assert result["new_nodes"] == len(gen_cache_utils._PYTREE_CACHE_CLASSES) - 1  # all but DynamicCache


FOREIGN_REGISTRATION = """
    import json
    import sys
    from torch.utils import _pytree as pytree
    from transformers.cache_utils import DynamicCache

    def flatten(cache):
        return [cache.layers], None

    def unflatten(children, context):
        cache = DynamicCache()
        cache.layers = children[0]
        return cache

    def flatten_with_keys(cache):
        return [(pytree.GetAttrKey("layers"), cache.layers)], None

    def import_generated():
        try:
            import generated
        except Exception as e:
            return {"error": type(e).__name__, "message": str(e)}
        return {"error": None, "flatten_module": pytree.SUPPORTED_NODES[DynamicCache].flatten_fn.__module__}

    # "bare": no flatten_with_keys_fn, no serialized_type_name; "keys": a flatten_with_keys_fn, no serialized name
    kwargs = {"keys": {"flatten_with_keys_fn": flatten_with_keys}}.get(sys.argv[1], {})
    pytree.register_pytree_node(DynamicCache, flatten, unflatten, **kwargs)
    node = pytree.SUPPORTED_NODES[DynamicCache]
    result = import_generated()
    result["node_kept"] = pytree.SUPPORTED_NODES[DynamicCache] is node
    if result["error"] is None:  # what a reuse of that registration leads to: the spec cannot be saved
        try:
            pytree.treespec_dumps(pytree.tree_flatten(DynamicCache())[1])
            result["dumps"] = "ok"
        except Exception as e:
            result["dumps"] = f"{type(e).__name__}: {e}"
    else:  # the error's advice works: once that registration is removed, the import registers its own
        pytree._deregister_pytree_node(DynamicCache)
        result["after_removing_it"] = import_generated()
    print(json.dumps(result))
"""


def _assert_refused(result):
    assert result["error"] == "ValueError", result
    assert result["message"].startswith("DynamicCache is already registered as a pytree node by `__main__`")
    assert "flatten_with_keys_fn" in result["message"] and "serialized_type_name" in result["message"]
    assert result["node_kept"]  # refused, not replaced: a class never gets a second node type


def test_importing_generated_after_a_bare_registration_raises_a_clear_error():
    result = last_json_line(run_python(FOREIGN_REGISTRATION, "bare"))
    _assert_refused(result)
    assert result["after_removing_it"] == {"error": None, "flatten_module": "generated._shared.cache_utils"}


def test_importing_generated_after_a_registration_without_serialized_name_raises():
    """torch records every registration in SUPPORTED_SERIALIZED_TYPES, with the name "NO_SERIALIZED_TYPE_NAME_FOUND"
    when none was given, so `cls not in SUPPORTED_SERIALIZED_TYPES` never refuses one made with
    `register_pytree_node`: such a registration is reused, and saving a program then fails."""
    result = last_json_line(run_python(FOREIGN_REGISTRATION, "keys"))
    _assert_refused(result)


def test_importing_generated_after_the_dynamo_exporter_registration_reuses_it():
    proc = run_python("""
        import json
        import torch
        import transformers
        import transformers.exporters.exporter_dynamo as d
        from torch.utils import _pytree as pytree
        from transformers.cache_utils import DynamicCache, EncoderDecoderCache

        config = transformers.LlamaConfig(
            num_hidden_layers=1, hidden_size=16, intermediate_size=32, num_attention_heads=2,
            num_key_value_heads=2, vocab_size=32,
        )
        d.register_cache_pytrees_for_model(transformers.LlamaForCausalLM(config))
        nodes = {cls: pytree.SUPPORTED_NODES[cls] for cls in (DynamicCache, EncoderDecoderCache)}
        import generated

        cache = DynamicCache()
        cache.update(torch.ones(1, 2, 3, 4), torch.zeros(1, 2, 3, 4), 0)
        leaves, spec = pytree.tree_flatten(cache)
        rebuilt = pytree.tree_unflatten(leaves, spec)
        print(json.dumps({
            "reused": all(pytree.SUPPORTED_NODES[cls] is node for cls, node in nodes.items()),
            "flatten_module": pytree.SUPPORTED_NODES[DynamicCache].flatten_fn.__module__,
            "round_trip": type(rebuilt) is DynamicCache and torch.equal(rebuilt.layers[0].keys, cache.layers[0].keys),
        }))
        """)
    result = last_json_line(proc)
    assert result == {
        "reused": True,
        "flatten_module": "transformers.exporters.exporter_dynamo",
        "round_trip": True,
    }


REUSE_THEN_SAVE_AND_LOAD = """
    import json
    import sys
    import torch
    from transformers.cache_utils import DynamicCache

    if sys.argv[1] == "executorch":
        from transformers.integrations.executorch import register_dynamic_cache_export_support

        register_dynamic_cache_export_support()
    else:
        import transformers
        import transformers.exporters.exporter_dynamo as d

        config = transformers.LlamaConfig(
            num_hidden_layers=1, hidden_size=16, intermediate_size=32, num_attention_heads=2,
            num_key_value_heads=2, vocab_size=32,
        )
        d.register_cache_pytrees_for_model(transformers.LlamaForCausalLM(config))
    import generated

    class UpdateCache(torch.nn.Module):
        def forward(self, k, v, cache):
            keys, _ = cache.update(k, v, 0)
            return keys.sum(), cache

    cache = DynamicCache()
    cache.update(torch.ones(2, 2, 3, 4), torch.ones(2, 2, 3, 4), 0)
    ep = torch.export.export(UpdateCache(), (torch.ones(2, 2, 1, 4), torch.ones(2, 2, 1, 4), cache), strict=False)
    torch.export.save(ep, sys.argv[2])
    torch.export.load(sys.argv[2])
    print(json.dumps({"safe_global": DynamicCache in torch.serialization.get_safe_globals()}))
"""


@pytest.mark.parametrize("first", ["executorch", "dynamo"])
def test_a_reused_registration_still_loads_saved_programs_with_weights_only(first, tmp_path):
    """`register_cache_pytree_node` adds a class to torch's safe globals only when it registers it itself: when it
    reuses an earlier registration, `torch.export.load` cannot unpickle the example inputs with weights_only and
    falls back to weights_only=False (with a warning, and a logging error from torch)."""
    proc = run_python(REUSE_THEN_SAVE_AND_LOAD, first, str(tmp_path / "program.pt2"))
    result = last_json_line(proc)
    fell_back = "Fallback to weights_only=False" in proc.stderr
    assert result["safe_global"] and not fell_back, (
        f"after a reused {first} registration, DynamicCache is a safe global: {result['safe_global']}; "
        f"torch.export.load fell back to weights_only=False: {fell_back}"
    )


def test_transformers_registrations_made_after_generated_leave_it_in_place():
    proc = run_python("""
        import json
        import transformers
        import transformers.exporters.exporter_dynamo as d
        from torch.utils import _pytree as pytree
        from transformers.integrations.executorch import register_dynamic_cache_export_support
        import generated
        from generated._shared.cache_utils import _PYTREE_CACHE_CLASSES

        nodes = {cls: pytree.SUPPORTED_NODES[cls] for cls in _PYTREE_CACHE_CLASSES.values()}
        register_dynamic_cache_export_support()
        config = transformers.LlamaConfig(
            num_hidden_layers=1, hidden_size=16, intermediate_size=32, num_attention_heads=2,
            num_key_value_heads=2, vocab_size=32,
        )
        d.register_cache_pytrees_for_model(transformers.LlamaForCausalLM(config))
        print(json.dumps({
            "replaced": [cls.__name__ for cls, node in nodes.items() if pytree.SUPPORTED_NODES[cls] is not node],
        }))
        """)
    assert last_json_line(proc) == {"replaced": []}


# ----------------------------------------------------------------------------------------------------------------
# 5. The committed generated/ package, and a model-local cache
# ----------------------------------------------------------------------------------------------------------------


def _transformers_cache_classes():
    roots = (cu.Cache, cu.CacheLayerMixin, cu.LinearAttentionCacheLayerMixin, cu.DummyLayer)
    return {
        name: cls
        for name, cls in vars(cu).items()
        if inspect.isclass(cls) and cls.__module__ == cu.__name__ and issubclass(cls, roots)
    }


def test_committed_generated_registers_transformers_own_classes():
    assert generated.TRANSFORMERS_VERSION == transformers.__version__
    assert transformers.cache_utils.DynamicCache in pytree.SUPPORTED_NODES
    assert transformers.DynamicCache is cu.DynamicCache
    registered = gen_cache_utils._PYTREE_CACHE_CLASSES
    for name, cls in _transformers_cache_classes().items():
        if inspect.isabstract(cls) and name in {"CacheLayerMixin", "LinearAttentionCacheLayerMixin"}:
            assert cls not in pytree.SUPPORTED_NODES
            continue
        # the name generated binds is transformers' class, or, where a rewrite changes methods (sliding-window and
        # linear-attention layers, and the caches that pick them), a subclass of it that overrides just those
        own = getattr(gen_cache_utils, name, cls)
        assert own is cls or (issubclass(own, cls) and own.__module__ == gen_cache_utils.__name__)
        assert cls in pytree.SUPPORTED_NODES, f"{name} is not registered"
        serialized = f"{cls.__module__}.{cls.__qualname__}"
        assert pytree.SUPPORTED_SERIALIZED_TYPES[cls].serialized_type_name == serialized
        assert registered[serialized] is cls
        assert cls in torch.serialization.get_safe_globals()
    # besides transformers' classes, only the subclasses the vendored cache_utils defines, each its own node type
    vendored = [cls for cls in registered.values() if cls.__module__ != "transformers.cache_utils"]
    assert sorted(cls.__name__ for cls in vendored) == [
        "DynamicCache",
        "DynamicSlidingWindowLayer",
        "LinearAttentionAndFullAttentionLayer",
        "LinearAttentionAndSlidingWindowAttentionLayer",
        "LinearAttentionAndStaticFullAttentionLayer",
        "LinearAttentionAndStaticSlidingWindowAttentionLayer",
        "LinearAttentionLayer",
        "StaticCache",
    ]
    assert all(cls.__module__ == gen_cache_utils.__name__ and cls in pytree.SUPPORTED_NODES for cls in vendored)


def test_committed_generated_models_import():
    proc = run_python("""
        import importlib
        import json
        import generated

        for name in generated.MODELS:
            importlib.import_module(f"generated.{name}")
        print(json.dumps({"models": list(generated.MODELS)}))
        """)
    assert last_json_line(proc)["models"]


MINIMAX_CHECK = """
    import json
    import torch
    import transformers
    from torch.utils import _pytree as pytree
    import generated.minimax
    from generated._shared.cache_utils import _PYTREE_CACHE_CLASSES
    from generated.minimax.modeling_minimax import MiniMaxCache

    g = torch.Generator().manual_seed(0)
    cache = MiniMaxCache()
    cache.update(torch.randn(2, 2, 3, 4, generator=g), torch.randn(2, 2, 3, 4, generator=g), 0)
    cache.set_linear_cache(2, torch.randn(2, 2, 4, 4, generator=g))  # layer 1 skipped: an empty list
    leaves, spec = pytree.tree_flatten(cache)
    spec = pytree.treespec_loads(pytree.treespec_dumps(spec))
    rebuilt = pytree.tree_unflatten([leaf.clone() for leaf in leaves], spec)

    def same(a, b):
        if type(a) is not type(b):
            return False
        if isinstance(a, torch.Tensor):
            return a.dtype == b.dtype and torch.equal(a, b)
        if type(a) in _PYTREE_CACHE_CLASSES.values():
            return a is not b and list(vars(a)) == list(vars(b)) and all(same(v, vars(b)[k]) for k, v in vars(a).items())
        if isinstance(a, (list, tuple)):
            return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
        return a is b if isinstance(a, type) else a == b

    print(json.dumps({
        "registered": MiniMaxCache in pytree.SUPPORTED_NODES,
        "serialized": pytree.SUPPORTED_SERIALIZED_TYPES[MiniMaxCache].serialized_type_name,
        "derives_from_transformers": transformers.cache_utils.DynamicCache in MiniMaxCache.__mro__,
        "round_trip": same(cache, rebuilt) and pytree.tree_flatten(rebuilt)[1] == spec,
        "paths": [pytree.keystr(p) for p, _ in pytree.tree_flatten_with_path(cache)[0]],
    }))
"""


def test_generated_model_local_cache_is_registered_and_round_trips(tmp_path):
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "exportsmith"),
            "generate",
            "minimax",
            "--out",
            str(tmp_path / "generated"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT,
    )
    assert proc.returncode == 0, proc.stderr
    result = last_json_line(run_python(MINIMAX_CHECK, cwd=tmp_path))
    assert result["registered"]
    assert result["serialized"] == "generated.minimax.modeling_minimax.MiniMaxCache"
    assert result["derives_from_transformers"]
    assert result["round_trip"]
    assert result["paths"] == [".layers[0].keys", ".layers[0].values", ".linear_cache[2]"]
