"""Seeded decoder-LM inputs at the shapes verification traces with and checks at.

A `Case` is (name, batch, new_tokens, past). `case_inputs` builds the keyword arguments of a forward call for one
case: `input_ids` of the new tokens, an all-ones `attention_mask` of length past + new_tokens, `use_cache=True`, and,
when past > 0, a cache produced by running a model on a seeded prefix: the original for the reference outputs, and
each subject for itself (a generated copy's cache holds its own layer classes, which its exported program expects;
the copies are bit-identical, so the caches hold the same tensors). A forward call grows the cache it is given in
place: build fresh inputs for every call.

The cache keyword and output field follow the installed transformers: `cache` in 5.x, `past_key_values` in 4.x.
`cache_keyword(model)` reads the forward's signature and `output_cache(outputs)` reads whichever field the output
has, so the same harness runs on both lines without a version switch.

Export examples use sizes >= 2 everywhere, because export specialises sizes 0 and 1; the evaluation cases then
cover batch 1, 1-token steps, short and long pasts, the first steps of a generation from a 1-token prompt (a 1-token
cache, past + new below the examples' sum), and total lengths on both sides of the tiny configs' sliding
window (`tiny.SLIDING_WINDOW`: the examples fit in it, the long cases do not). Refuses nothing; it only builds tensors.
"""

import inspect
from typing import NamedTuple

import torch

from exportsmith.verify.tasks import random_tokens
from exportsmith.verify.tolerance import allowed


class Case(NamedTuple):
    name: str
    batch: int
    new_tokens: int
    past: int


DECODE_EXAMPLE = Case("decode-example", batch=2, new_tokens=3, past=5)
DECODE_CASES = (
    DECODE_EXAMPLE,
    Case("decode-step-batch1", batch=1, new_tokens=1, past=7),
    Case("short-past", batch=3, new_tokens=4, past=2),
    Case("long-past", batch=1, new_tokens=6, past=11),
    Case("decode-step-batch4", batch=4, new_tokens=1, past=9),
    # the first decode steps of a generation from a 1- or 2-token prompt: past + new below the examples' 2 + 2
    Case("first-step", batch=1, new_tokens=1, past=1),
    Case("first-step-batch4", batch=4, new_tokens=1, past=1),
    Case("two-tokens-past1", batch=1, new_tokens=2, past=1),
    Case("second-step", batch=1, new_tokens=1, past=2),
)

# The decode example of a model whose multi-token steps after a cache are not its one-token steps (`step_gap`): it
# decodes one token at a time, as generate() calls it
ONE_TOKEN_DECODE_EXAMPLE = Case("one-token-example", batch=2, new_tokens=1, past=5)

PREFILL_EXAMPLE = Case("prefill-example", batch=2, new_tokens=5, past=0)
PREFILL_CASES = (
    PREFILL_EXAMPLE,
    Case("prefill-batch1", batch=1, new_tokens=7, past=0),
    Case("prefill-one-token", batch=1, new_tokens=1, past=0),
    Case("prefill-batch3", batch=3, new_tokens=4, past=0),
    Case("prefill-past-window", batch=1, new_tokens=12, past=0),  # longer than tiny configs' sliding window
)


def case_seed(case: Case) -> int:
    """A seed that differs between cases of different shapes and is the same on every run."""
    return case.batch * 10_000 + case.new_tokens * 100 + case.past


# Cache keywords of a forward, newest first: 5.x renamed `past_key_values` to `cache`.
CACHE_KEYWORDS = ("cache", "past_key_values")


def cache_keyword(model: torch.nn.Module) -> str | None:
    """The forward's cache parameter (`cache` or `past_key_values`), or None when it takes no cache."""
    parameters = inspect.signature(model.forward).parameters
    return next((name for name in CACHE_KEYWORDS if name in parameters), None)


def output_cache(outputs):
    """The cache a forward returned: the first of the output's `cache`/`past_key_values` fields that is set."""
    for name in CACHE_KEYWORDS:
        value = getattr(outputs, name, None)
        if value is not None:
            return value
    return None


def case_inputs(cache_model: torch.nn.Module, vocab_size: int, case: Case) -> dict:
    """Forward kwargs for `case`; the cache of the past tokens (if any) comes from `cache_model`. A step after a
    cache takes no attention mask where generate() passes it none (`decode_takes_mask`)."""
    generator = torch.Generator().manual_seed(case_seed(case))
    prefix_ids = random_tokens(vocab_size, (case.batch, case.past), generator)
    input_ids = random_tokens(vocab_size, (case.batch, case.new_tokens), generator)
    inputs = {
        "input_ids": input_ids,
        "attention_mask": torch.ones(case.batch, case.past + case.new_tokens, dtype=torch.long),
        "use_cache": True,
    }
    if case.past:
        with torch.no_grad():
            prefix = cache_model(input_ids=prefix_ids, attention_mask=torch.ones_like(prefix_ids), use_cache=True)
        inputs[cache_keyword(cache_model)] = output_cache(prefix)
        if not decode_takes_mask(cache_model):
            del inputs["attention_mask"]
    return inputs


def decode_takes_mask(model: torch.nn.Module) -> bool:
    """Whether generate() passes an attention mask to a step after the first: what the model's
    `prepare_inputs_for_generation` keeps of one (Mamba's drops it, and its forward takes a mask of the new tokens
    only). Asked once per model class, of a 2-token prompt's cache."""
    kind = type(model)
    if kind not in _DECODE_TAKES_MASK:
        _DECODE_TAKES_MASK[kind] = _keeps_mask(model)
    return _DECODE_TAKES_MASK[kind]


_DECODE_TAKES_MASK: dict[type, bool] = {}


def _keeps_mask(model: torch.nn.Module) -> bool:
    prepare = getattr(model, "prepare_inputs_for_generation", None)
    keyword = cache_keyword(model)
    if prepare is None or keyword is None:
        return True
    prompt = torch.ones(1, 2, dtype=torch.long)
    try:
        with torch.no_grad():
            cache = output_cache(model(input_ids=prompt, attention_mask=torch.ones_like(prompt), use_cache=True))
        ids = torch.ones(1, 3, dtype=torch.long)
        prepared = prepare(
            ids, attention_mask=torch.ones_like(ids), use_cache=True, is_first_iteration=False, **{keyword: cache}
        )
    except Exception:
        return True  # a model whose preparation needs more than a prompt: the mask, as for every other model
    return prepared.get("attention_mask") is not None


def step_gap(model: torch.nn.Module, vocab_size: int) -> tuple[float, float]:
    """(max |diff|, the rounding allowed) between the logits of 3 new tokens decoded in one step after a 5-token
    prompt's cache and the same tokens decoded one at a time: within rounding for a transformer (about 1e-7 on the
    tiny models, against 1e-5), beyond it where the model takes another path for several tokens than for one
    (Mamba's multi-token step restarts its state from zero: 0.018). Asked once per model class; (0.0, 0.0) where the
    model cannot be asked (no cache keyword, a failing call)."""
    kind = type(model)
    if kind not in _STEP_GAP:
        _STEP_GAP[kind] = _step_gap(model, vocab_size)
    return _STEP_GAP[kind]


_STEP_GAP: dict[type, tuple[float, float]] = {}


def _step_gap(model: torch.nn.Module, vocab_size: int) -> tuple[float, float]:
    keyword = cache_keyword(model)
    if keyword is None:
        return 0.0, 0.0
    generator = torch.Generator().manual_seed(0)
    prefix = random_tokens(vocab_size, (1, 5), generator)
    new = random_tokens(vocab_size, (1, 3), generator)
    masked = decode_takes_mask(model)

    def prompt_cache():
        return output_cache(model(input_ids=prefix, attention_mask=torch.ones_like(prefix), use_cache=True))

    def call(ids, past, cache):
        mask = {"attention_mask": torch.ones(1, past + ids.shape[1], dtype=torch.long)} if masked else {}
        return model(input_ids=ids, use_cache=True, **mask, **{keyword: cache})

    try:
        with torch.no_grad():
            whole = call(new, prefix.shape[1], prompt_cache()).logits
            cache, stepped = prompt_cache(), []
            for index in range(new.shape[1]):
                out = call(new[:, index : index + 1], prefix.shape[1] + index, cache)
                cache = output_cache(out)
                stepped.append(out.logits[:, -1])
    except Exception:
        return 0.0, 0.0
    if whole.shape[1] != new.shape[1]:  # logits of the last position only
        return 0.0, 0.0
    return (whole.float() - torch.stack(stepped, 1).float()).abs().max().item(), allowed([whole])
