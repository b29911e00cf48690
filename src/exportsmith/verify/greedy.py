"""Greedy generation driven only by exported programs, against transformers' `generate(do_sample=False)`.

What a user of a decoder LM's programs does: run the prefill program on the prompt, take the argmax of the last
position's logits, then feed that token, a grown attention mask and the cache the last program returned to the
decode program, again and again. `greedy_loops` does exactly that for prompts of `PROMPT_LENGTHS` tokens at
`BATCHES` (seeded, no padding), `NEW_TOKENS` steps each, and compares the token ids with the original model's
`GenerationMixin.generate(do_sample=False)` on the same prompt: the plain generation loop, without EOS (every row
runs all the steps) and without the logits processing a model's generation config asks for (forced or suppressed
tokens, penalties: the same post-processing of any program's logits), not a model's own `generate` override. An encoder-decoder's loop starts
from its decoder start token with the forward program (encoder inputs and that one token), then runs the decode
program with the encoder's output, the encoder's attention mask and the cache. An encoder that takes audio or images
(whisper, a vision encoder-decoder) is given them instead of a prompt: the seeded inputs of the model's forward
program at each batch (`encoder_inputs`), one loop per batch.

A model that is not a `GenerationMixin` (a decoder tower such as pix2struct's text model) has no generate() to match:
it gets no loop (its container's loop drives it).

A model whose generate() gives more than one id per row and step (csm's audio codebooks) gets no loop: a loop that
takes the argmax of the logits is not how its programs are used.

A program's logits may differ from eager's by rounding (`tolerance.py`); where eager's two best tokens at a
step are that close, the programs may pick the other one and the rest of the generation then differs for a reason
that is not a bug. Such a step is reported as a tie (`GreedyRecord.tie`) and passes; any other difference fails.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import GenerationConfig
from transformers.generation.utils import GenerationMixin

from exportsmith.verify.errors import first_line
from exportsmith.verify.inputs import cache_keyword, decode_takes_mask, output_cache
from exportsmith.verify.tasks import forward_parameters, main_input, random_tokens
from exportsmith.verify.tolerance import RTOL

PROMPT_LENGTHS = (1, 2, 12)
BATCHES = (1, 2)
NEW_TOKENS = 16


@dataclass
class GreedyRecord:
    """One loop: whether the programs' tokens equal generate()'s, the first step where they differ, or an error."""

    batch: int
    prompt: int | None  # the prompt's length; None for an encoder's audio or image inputs
    media: str | None = None  # the encoder's main input (`input_features`, `pixel_values`) when it is not text
    match: bool = False
    first_difference: int | None = None
    tie: bool = False  # the first difference is at a step where eager's two best logits are within rounding
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and (self.match or self.tie)

    @property
    def name(self) -> str:
        return f"batch{self.batch}-" + (self.media if self.media is not None else f"prompt{self.prompt}")

    def describe(self) -> str:
        if self.error is not None:
            return f"{self.name}: {self.error}"
        if self.match:
            return f"{self.name}: same {NEW_TOKENS} tokens"
        kind = "tie" if self.tie else "differs"
        return f"{self.name}: {kind} from step {self.first_difference}"


Runnable = Callable[..., object]


class NotATokenLoop(Exception):
    """generate() of this model does not give one token id per row and step (an audio model's codebooks): a loop that
    takes the argmax of the logits is not how its programs are used, and no loop runs."""


EncoderInputs = Callable[[int], dict]


def greedy_loops(
    original: torch.nn.Module,
    prefill: Runnable,
    decode: Runnable,
    encoder_decoder: bool,
    vocab_size: int,
    tolerance: float,
    encoder_inputs: EncoderInputs | None = None,
    encoder_outputs: Callable[[torch.Tensor], object] = lambda last_hidden_state: (last_hidden_state,),
) -> list[GreedyRecord]:
    """A greedy loop for each prompt length and batch: `prefill` (a decoder LM's prefill program, or an
    encoder-decoder's forward program) then `decode`, against `original`'s generate. `encoder_inputs(batch)`, for an
    encoder-decoder whose encoder does not take text: its forward program's inputs at that batch (one loop a batch).
    `encoder_outputs(last_hidden_state)`: the decode program's `encoder_outputs` (default: a tuple)."""
    if not isinstance(original, GenerationMixin):
        return []
    media = main_input(original, forward_parameters(original)) if encoder_inputs is not None else None
    records = []
    for batch in BATCHES:
        for length in PROMPT_LENGTHS if media is None else (None,):
            record = GreedyRecord(batch, length, media)
            if media is None:
                generator = torch.Generator().manual_seed(7_000 + batch * 100 + length)
                prompt = random_tokens(vocab_size, (batch, length), generator)
                inputs = {"input_ids": prompt, "attention_mask": torch.ones_like(prompt)}
            else:
                inputs = encoder_inputs(batch)
            try:
                expected, expected_logits = reference(original, inputs)
                if encoder_decoder:
                    actual = encoder_decoder_loop(original, prefill, decode, inputs, encoder_outputs)
                else:
                    actual = decoder_loop(original, prefill, decode, inputs["input_ids"])
            except NotATokenLoop:
                return []  # the same for every prompt
            except Exception as error:
                record.error = first_line(error)
                records.append(record)
                continue
            if actual.shape != expected.shape:
                record.error = (
                    f"the programs' loop gave {tuple(actual.shape)} token ids, generate() {tuple(expected.shape)}"
                )
                records.append(record)
                continue
            differs = (expected != actual).any(dim=0).nonzero()
            if not len(differs):
                record.match = True
            else:
                step = int(differs[0])
                record.first_difference = step
                record.tie = is_tie(expected_logits[step], expected[:, step], actual[:, step], tolerance)
            records.append(record)
    return records


def is_tie(logits: torch.Tensor, expected: torch.Tensor, actual: torch.Tensor, tolerance: float) -> bool:
    """Whether, in every row, eager's logit of the token eager chose and of the token the program chose ([batch,
    vocab] logits, [batch] ids) are within rounding of each other: programs that differ from eager by `tolerance`
    plus the relative rounding of the row's logits (tolerance.RTOL) could have chosen either."""
    chosen = logits.gather(-1, expected[:, None])
    other = logits.gather(-1, actual[:, None])
    rounding = tolerance + RTOL * logits.abs().amax(dim=-1, keepdim=True)
    return bool(((chosen - other).abs() <= 2 * rounding).all())


# Where an encoder-decoder's first decoder token is found, in order (generate's own order, then its decoder's config:
# a composite EncoderDecoderModel leaves its own None)
_START_TOKENS = ("decoder_start_token_id", "bos_token_id", "pad_token_id")


def decoder_start(model: torch.nn.Module) -> int | None:
    """An encoder-decoder's decoder start token: the first set of `_START_TOKENS` in its generation config, its config
    and its decoder's config; 0 when none is (generate would refuse to start, and a user then picks one)."""
    decoder = getattr(model.config, "decoder", None)
    for holder in (model.generation_config, model.config, decoder):
        for name in _START_TOKENS:
            value = getattr(holder, name, None)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
    return 0 if model.config.is_encoder_decoder else None


def generation_config(model: torch.nn.Module) -> GenerationConfig:
    """Greedy, `NEW_TOKENS` new tokens, no EOS (every row runs every step); the model's start and pad tokens."""
    start = decoder_start(model)
    return GenerationConfig(
        max_new_tokens=NEW_TOKENS,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=model.generation_config.pad_token_id,
        bos_token_id=model.generation_config.bos_token_id,
        decoder_start_token_id=start,
        output_logits=True,
        return_dict_in_generate=True,
    )


def reference(model: torch.nn.Module, inputs: dict) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The new token ids ([batch, NEW_TOKENS]) of the plain generation loop on `inputs` (a prompt's `input_ids` and
    `attention_mask`, or an encoder's inputs), and its logits per step."""
    config = generation_config(model)
    # generate() fills the fields a given config leaves None from the model's own generation config: that one must
    # hold no EOS either (a row that produced it would be padded, and the loop would stop early) and no logits
    # processing (blenderbot's forced EOS at the last step, bart's forced BOS, suppressed tokens, penalties): the
    # plain loop takes the argmax of the model's logits, as the programs' loop does
    saved = model.generation_config
    model.generation_config = GenerationConfig(
        pad_token_id=config.pad_token_id,
        bos_token_id=config.bos_token_id,
        decoder_start_token_id=config.decoder_start_token_id,
    )
    torch.manual_seed(0)
    try:
        with torch.no_grad():
            out = GenerationMixin.generate(model, **generate_inputs(model, inputs), generation_config=config)
    finally:
        model.generation_config = saved
    if out.sequences.dim() != 2:  # csm's codebooks: [batch, steps, codebooks]
        raise NotATokenLoop(f"generate() gives sequences of shape {tuple(out.sequences.shape)}")
    if out.sequences.shape[1] < NEW_TOKENS or len(out.logits) != NEW_TOKENS:
        raise RuntimeError(f"generate() gave {len(out.logits)} new tokens, not {NEW_TOKENS}")
    return out.sequences[:, -NEW_TOKENS:], [logits.float() for logits in out.logits]


def decoder_loop(model: torch.nn.Module, prefill: Runnable, decode: Runnable, prompt: torch.Tensor) -> torch.Tensor:
    """The new token ids of a decoder LM's greedy loop driven by its prefill and decode programs."""
    keyword = cache_keyword(model)
    batch, length = prompt.shape
    with torch.no_grad():
        out = prefill(input_ids=prompt, attention_mask=torch.ones(batch, length, dtype=torch.long), use_cache=True)
        tokens = [out.logits[:, -1].argmax(-1, keepdim=True)]
        masked = decode_takes_mask(model)  # as generate() passes it (Mamba's steps take none)
        for step in range(1, NEW_TOKENS):
            mask = {"attention_mask": torch.ones(batch, length + step, dtype=torch.long)} if masked else {}
            out = decode(input_ids=tokens[-1], use_cache=True, **mask, **{keyword: output_cache(out)})
            tokens.append(out.logits[:, -1].argmax(-1, keepdim=True))
    return torch.cat(tokens, dim=1)


def encoder_only(inputs: dict) -> dict:
    """`inputs` without the decoder's: what generate() takes (it starts the decoder itself)."""
    return {name: value for name, value in inputs.items() if not name.startswith("decoder_")}


def generate_inputs(model: torch.nn.Module, inputs: dict) -> dict:
    """What generate() takes of a loop's `inputs`: the encoder's, and no `input_ids` beside an encoder's audio or
    images (generate would take them for the decoder's prompt, where the loop starts from the start token)."""
    encoder = encoder_only(inputs)
    if main_input(model, forward_parameters(model)) != "input_ids":
        encoder.pop("input_ids", None)
    return encoder


def encoder_decoder_loop(
    model: torch.nn.Module, forward: Runnable, decode: Runnable, inputs: dict, encoder_outputs: Callable
) -> torch.Tensor:
    """The new token ids of an encoder-decoder's greedy loop: the forward program on the encoder's `inputs` (a prompt
    and its mask, or audio or images), the decoder start token and `use_cache=True`, then the decode program with the
    encoder's output (`encoder_outputs(last_hidden_state)`), the encoder's attention mask (where its inputs have one)
    and the cache."""
    keyword = cache_keyword(model)
    encoder = encoder_only(inputs)
    batch = encoder[main_input(model, forward_parameters(model))].shape[0]
    start = generation_config(model).decoder_start_token_id
    mask = {"attention_mask": encoder["attention_mask"]} if "attention_mask" in encoder else {}
    with torch.no_grad():
        decoder_ids = torch.full((batch, 1), start, dtype=torch.long)
        out = forward(**encoder, decoder_input_ids=decoder_ids, use_cache=True)
        encoder_state = encoder_outputs(out.encoder_last_hidden_state)
        tokens = [out.logits[:, -1].argmax(-1, keepdim=True)]
        for _ in range(1, NEW_TOKENS):
            out = decode(
                encoder_outputs=encoder_state,
                decoder_input_ids=tokens[-1],
                use_cache=True,
                **mask,
                **{keyword: output_cache(out)},
            )
            tokens.append(out.logits[:, -1].argmax(-1, keepdim=True))
    return torch.cat(tokens, dim=1)
