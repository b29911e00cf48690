"""Seeded decoder-LM inputs at the shapes verification traces with and checks at.

A `Case` is (name, batch, new_tokens, past). `case_inputs` builds the keyword arguments of a forward call for one
case: `input_ids` of the new tokens, an all-ones `attention_mask` of length past + new_tokens, `use_cache=True`, and,
when past > 0, a `cache` produced by running the ORIGINAL model on a seeded prefix (so every copy under test is fed
the same, reference cache). A forward call grows the cache it is given in place: build fresh inputs for every call.

Export examples use sizes >= 2 everywhere, because export specialises sizes 0 and 1; the evaluation cases then
cover batch 1, 1-token steps, short and long pasts, and total lengths on both sides of the tiny configs' sliding
window (`tiny.SLIDING_WINDOW`: the examples fit in it, the long cases do not). Refuses nothing; it only builds tensors.
"""

from typing import NamedTuple

import torch

from exportsmith.verify.tasks import random_tokens


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
)

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


def case_inputs(reference_model: torch.nn.Module, vocab_size: int, case: Case) -> dict:
    """Forward kwargs for `case`; the cache of the past tokens (if any) comes from `reference_model`."""
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
            prefix = reference_model(input_ids=prefix_ids, attention_mask=torch.ones_like(prefix_ids), use_cache=True)
        inputs["cache"] = prefix.cache
    return inputs
