"""Real configurations of popular checkpoints, their layers reduced: what users export, at real widths.

The tiny configs of `tiny.py` find what a model's code does; they do not find what only real sizes do: a vocabulary
of 262k, a head size of 256, grouped queries with 1 key head, a sliding window of 512 or 4096 tokens that a long
prompt crosses, rope scaling. `real_configs/<owner>--<name>.json` holds the `config.json` of popular checkpoints,
written out (the project never reaches the hub); `real_config(name)` loads one with its layer count reduced
(`LAYERS`, enough to hold each kind of layer the model alternates) and every other field as released, including the
lists that have one entry per layer (`layer_types`), cut to the new count.

`window_cases(config)` adds, for a model whose attention slides, the cases that cross its window: a decode chunk
that straddles it, a 1-token step on a cache longer than it, and a prefill longer than it.
"""

from __future__ import annotations

import json
from pathlib import Path

from transformers import AutoConfig, PretrainedConfig

from exportsmith.verify.inputs import Case

CONFIG_DIR = Path(__file__).parent / "real_configs"
DEFAULT_LAYERS = 2
# Layers kept where 2 would drop a kind of layer or would not fit the memory budget (8 GB a model, float32)
LAYERS = {
    "google--gemma-3-1b-it": 6,  # five sliding-window layers, then one global
    "mistralai--Mixtral-8x7B-v0.1": 1,  # 1.6 B parameters a layer
    "mistralai--Mistral-7B-v0.1": 1,  # every layer slides: one holds each kind (two peaked at 8.4 GB)
}


def real_config_names() -> list[str]:
    return sorted(path.stem for path in CONFIG_DIR.glob("*.json"))


def real_config(name: str, layers: int | None = None) -> PretrainedConfig:
    """The config of checkpoint `name` (a file stem of `real_configs/`), `layers` layers (default `LAYERS`)."""
    path = CONFIG_DIR / f"{name}.json"
    if not path.is_file():
        raise LookupError(f"no real config {name!r}; one of: {', '.join(real_config_names())}")
    return load_config(json.loads(path.read_text()), layers or LAYERS.get(name, DEFAULT_LAYERS))


def load_config(fields: dict, layers: int | None = None) -> PretrainedConfig:
    """The config of a checkpoint's `config.json` fields, with `layers` layers (None: all of them)."""
    if "model_type" not in fields:
        raise ValueError("no model_type")
    config = AutoConfig.for_model(**fields)
    if layers is None:
        return config
    before = config.num_hidden_layers
    reduced = {"num_hidden_layers": layers}
    for key in ("num_decoder_layers", "encoder_layers", "decoder_layers"):  # encoder-decoders count both stacks
        if isinstance(getattr(config, key, None), int):
            reduced[key] = layers
    for key, value in config.to_dict().items():
        if isinstance(value, list) and len(value) == before and key not in ("architectures", "eos_token_id"):
            reduced[key] = value[:layers]  # one entry per layer
    fields = {**config.to_dict(), **reduced}
    return type(config)(**{key: value for key, value in fields.items() if key != "model_type"})


def sliding_window(config: PretrainedConfig) -> int | None:
    """The window of the config's sliding-window layers, when it has any."""
    window = getattr(config, "sliding_window", None)
    if not isinstance(window, int) or getattr(config, "use_sliding_window", True) is False:
        return None
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and not any("sliding" in kind for kind in layer_types):
        return None
    return window


def window_cases(config: PretrainedConfig) -> tuple[tuple[Case, ...], tuple[Case, ...]]:
    """(decode cases, prefill cases) that cross the config's sliding window; none for a model without one."""
    window = sliding_window(config)
    if window is None:
        return (), ()
    decode = (
        Case("window-straddle", batch=1, new_tokens=4, past=window - 2),
        Case("window-crossed", batch=1, new_tokens=1, past=window + 5),
    )
    return decode, (Case("prefill-window-crossed", batch=1, new_tokens=window + 3, past=0),)
