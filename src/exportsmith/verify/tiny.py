"""Tiny, deterministic configs for decoder LMs, so that verification builds and exports a model in seconds.

`tiny_config(model_type)` starts from the model type's default config and shrinks every size attribute the config
has (a generic table of attribute name -> value, resolved through the config's `attribute_map`, so gpt2's
`n_embd`/`n_layer`/... are covered by `hidden_size`/`num_hidden_layers`/...), trims `layer_types` to the layer count
and moves special token ids inside the vocabulary. Sliding windows keep their defaults (larger than every
verification length).

Refuses (ValueError) model types that are not decoder LMs, i.e. not in transformers'
`MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`.
"""

from transformers import AutoConfig, PretrainedConfig
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

VOCAB_SIZE = 128
HIDDEN_SIZE = 32
NUM_LAYERS = 2
NUM_HEADS = 4
NUM_KV_HEADS = 2  # divides NUM_HEADS, so grouped-query attention paths are exercised
MAX_POSITIONS = 128

# Applied only where the default config has the attribute (directly or through its attribute_map).
TINY_SIZES = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": HIDDEN_SIZE,
    "num_hidden_layers": NUM_LAYERS,
    "num_attention_heads": NUM_HEADS,
    "num_key_value_heads": NUM_KV_HEADS,
    "head_dim": HIDDEN_SIZE // NUM_HEADS,
    "intermediate_size": 64,
    "n_inner": 64,
    "max_position_embeddings": MAX_POSITIONS,
    "original_max_position_embeddings": MAX_POSITIONS,
    # mixture of experts
    "num_local_experts": 4,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 64,
}

# Special token ids: any id the config sets is moved to these, all inside VOCAB_SIZE.
TINY_TOKEN_IDS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}

# Per model type, only where the generic rule cannot work: attribute -> value, applied after it.
MODEL_OVERRIDES: dict[str, dict] = {}


def tiny_config(model_type: str) -> PretrainedConfig:
    """A tiny config of `model_type` (~128 vocab, hidden 32, 2 layers, 4 heads, 2 kv heads, 4 experts top-2)."""
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ValueError(f"{model_type!r} is not a decoder LM (not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)")
    default = AutoConfig.for_model(model_type)
    overrides = {}
    for name, value in TINY_SIZES.items():
        attribute = default.attribute_map.get(name, name)
        if hasattr(default, attribute):
            overrides[attribute] = value
    layer_types = getattr(default, "layer_types", None)
    if layer_types is not None:
        overrides["layer_types"] = list(layer_types[:NUM_LAYERS])
    for name, value in TINY_TOKEN_IDS.items():
        if getattr(default, name, None) is not None:
            overrides[name] = value
    overrides.update(MODEL_OVERRIDES.get(model_type, {}))
    return AutoConfig.for_model(model_type, **overrides)
