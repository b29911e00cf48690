"""The greedy-loop check: loops driven by programs against transformers' generate(do_sample=False).

The loops are run here with the eager model itself standing in for its programs (they must then give generate's
tokens exactly, which checks that the loop feeds tokens, masks and caches as generate does), and with a decode step
that picks another token at one step (a difference, found at that step)."""

from functools import partial

import pytest
import torch

from transformers.modeling_outputs import BaseModelOutput

from exportsmith.verify.check import MAX_ABS_DIFF, build_pair, media_encoder_inputs, programs_for
from exportsmith.verify.encoder_outputs import greedy_encoder_outputs
from exportsmith.verify.greedy import NEW_TOKENS, PROMPT_LENGTHS, greedy_loops, is_tie, reference
from exportsmith.verify.tasks import forward_parameters, main_input, vocab


@pytest.mark.parametrize("model_type", ["llama", "gpt2", "t5"])
def test_loops_driven_by_the_eager_model_give_generates_tokens(model_type):
    original, _ = build_pair(model_type, None)
    encoder_decoder = original.config.is_encoder_decoder
    loops = greedy_loops(original, original, original, encoder_decoder, vocab(original.config), MAX_ABS_DIFF)
    assert [(loop.batch, loop.prompt) for loop in loops] == [(b, p) for b in (1, 2) for p in PROMPT_LENGTHS]
    assert all(loop.match and loop.error is None for loop in loops), [loop.describe() for loop in loops]


def test_generate_runs_every_step_even_where_the_model_produces_eos():
    original, _ = build_pair("llama", None)
    eos = original.generation_config.eos_token_id
    # make EOS the best token everywhere: generate with the model's own config would stop after one token
    with torch.no_grad():
        original.lm_head.bias = torch.nn.Parameter(torch.zeros(original.config.vocab_size))
        original.lm_head.bias[eos] = 1e3
    prompt = torch.tensor([[5, 6]])
    tokens, logits = reference(original, {"input_ids": prompt, "attention_mask": torch.ones_like(prompt)})
    assert tokens.shape == (1, NEW_TOKENS) and len(logits) == NEW_TOKENS
    assert (tokens == eos).all()
    assert original.generation_config.eos_token_id == eos  # the model's own config is left as it was


class _SwapsAtStep:
    """The model as a decode program, except that at its `step`-th call it picks eager's second-best token."""

    def __init__(self, model, step: int):
        self.model, self.step, self.calls = model, step, 0

    def __call__(self, **inputs):
        out = self.model(**inputs)
        self.calls += 1
        if self.calls == self.step:
            logits = out.logits.clone()
            second = logits[:, -1].topk(2).indices[:, 1]
            logits[torch.arange(len(second)), -1, second] = logits[:, -1].max(-1).values + 1.0
            out.logits = logits
        return out


def test_a_decode_step_that_picks_another_token_is_a_difference_from_that_step():
    original, _ = build_pair("llama", None)
    loops = greedy_loops(original, original, _SwapsAtStep(original, 3), False, vocab(original.config), MAX_ABS_DIFF)
    first = loops[0]
    assert not first.ok and not first.match and not first.tie
    assert first.first_difference == 3  # token 0 comes from the prefill, the 3rd decode call makes token 3
    assert first.describe() == "batch1-prompt1: differs from step 3"


def test_a_tie_is_two_tokens_within_rounding_in_every_row():
    logits = torch.tensor([[1.0, 1.0 + MAX_ABS_DIFF, 0.0], [2.0, 0.0, 0.5]])
    assert is_tie(logits, torch.tensor([1, 0]), torch.tensor([0, 0]), MAX_ABS_DIFF)
    assert not is_tie(logits, torch.tensor([1, 0]), torch.tensor([0, 2]), MAX_ABS_DIFF)
    assert not is_tie(logits, torch.tensor([1, 0]), torch.tensor([2, 0]), MAX_ABS_DIFF)


def test_generate_applies_no_logits_processing_of_the_models_generation_config():
    # blenderbot's config forces EOS at the last step: the programs' loop takes the argmax, and so must generate
    original, _ = build_pair("blenderbot", None)
    assert original.generation_config.forced_eos_token_id is not None
    loops = greedy_loops(original, original, original, True, vocab(original.config), MAX_ABS_DIFF)
    assert all(loop.match for loop in loops), [loop.describe() for loop in loops]
    assert original.generation_config.forced_eos_token_id is not None  # left as it was


def test_an_encoder_decoder_without_a_start_token_starts_from_its_decoders_or_zero():
    from exportsmith.verify.greedy import decoder_start

    original, _ = build_pair("encoder-decoder", None)
    loops = greedy_loops(original, original, original, True, vocab(original.config), MAX_ABS_DIFF)
    assert all(loop.match for loop in loops), [loop.describe() for loop in loops]
    assert decoder_start(original) is not None
    t5, _ = build_pair("t5", None)
    assert decoder_start(t5) == t5.config.pad_token_id  # T5 starts from its pad token


def test_a_model_whose_generate_gives_codebooks_gets_no_loop():
    original, _ = build_pair("csm", None)
    assert greedy_loops(original, original, original, False, vocab(original.config), MAX_ABS_DIFF) == []


@pytest.mark.parametrize("model_type", ["whisper", "vision-encoder-decoder", "pix2struct", "pp_formulanet"])
def test_an_encoder_of_audio_or_images_is_given_its_forward_inputs_not_a_prompt(model_type):
    # a text prompt would be no input for these encoders (whisper: "expects the mel input features to be of length
    # 256"); pix2struct's config does not cache by default, so its first step must ask for the cache; pp_formulanet's
    # forward also takes decoder `input_ids`, which generate() would take for the decoder's prompt
    original, _ = build_pair(model_type, None)
    encoder_inputs = media_encoder_inputs(original)
    assert encoder_inputs is not None
    loops = greedy_loops(original, original, original, True, vocab(original.config), MAX_ABS_DIFF, encoder_inputs)
    main = main_input(original, forward_parameters(original))
    assert [loop.name for loop in loops] == [f"batch1-{main}", f"batch2-{main}"]
    assert all(loop.match and loop.error is None for loop in loops), [loop.describe() for loop in loops]


def test_a_text_encoder_decoders_forward_program_asks_for_the_cache_and_its_loops_draw_prompts():
    original, _ = build_pair("t5", None)
    assert media_encoder_inputs(original) is None
    forward = next(program for program in programs_for(original) if program.name == "forward")
    assert all(case.inputs()["use_cache"] is True for case in forward.cases)


def test_a_model_without_generate_gets_no_loop():
    original, _ = build_pair("pix2struct_text_model", None)  # a decoder tower: its container generates
    assert not hasattr(original, "generate")
    assert greedy_loops(original, original, original, False, vocab(original.config), MAX_ABS_DIFF) == []


def test_a_model_that_reads_its_encoder_outputs_by_name_gets_its_encoders_own_output_object():
    # t5 wraps a tuple itself (the simplest form a runtime feeds); t5gemma reads `encoder_outputs.last_hidden_state`
    # ("'tuple' object has no attribute 'last_hidden_state'" on a tuple) and gets what its encoder returns, as
    # generate() gives it; the greedy loop builds the same form from the forward program's encoder state
    for model_type, form in (("t5", tuple), ("t5gemma", BaseModelOutput)):
        original, _ = build_pair(model_type, None)
        decode = programs_for(original)[0]
        assert decode.name == "decode"
        encoder_outputs = decode.cases[0].inputs()["encoder_outputs"]
        assert type(encoder_outputs) is form and len(encoder_outputs) == 1  # a ModelOutput: its non-None fields
        built = greedy_encoder_outputs(original, encoder_outputs[0])
        assert type(built) is type(encoder_outputs)
        loops = greedy_loops(
            original,
            original,
            original,
            True,
            vocab(original.config),
            MAX_ABS_DIFF,
            encoder_outputs=partial(greedy_encoder_outputs, original),
        )
        assert loops and all(loop.match for loop in loops), [loop.describe() for loop in loops]


def test_an_encoder_of_images_beside_a_prompt_is_given_its_forward_inputs():
    # florence2's forward takes `input_ids` (its task prompt) and `pixel_values`: a prompt alone is no input for it
    original, _ = build_pair("florence2", None)
    encoder_inputs = media_encoder_inputs(original)
    assert encoder_inputs is not None and "pixel_values" in encoder_inputs(1)
    t5, _ = build_pair("t5", None)
    assert media_encoder_inputs(t5) is None


def test_a_greedy_loop_refuses_an_encoder_output_with_fields_the_forward_program_does_not_return():
    # the forward program returns the encoder's last hidden state only: a decode program that takes more of the
    # encoder's output (a downsampled mask) cannot be fed from it, and the loop says so instead of guessing
    from transformers.modeling_outputs import BaseModelOutput

    from exportsmith.verify import encoder_outputs

    model, state = torch.nn.Linear(1, 1), torch.ones(1, 2, 3)
    assert greedy_encoder_outputs(model, state)[0] is state  # a model never seen: the tuple
    encoder_outputs._FORMS[model] = encoder_outputs.EncoderOutputForm(BaseModelOutput, ("last_hidden_state",))
    assert greedy_encoder_outputs(model, state).last_hidden_state is state
    both = ("last_hidden_state", "attentions")
    encoder_outputs._FORMS[model] = encoder_outputs.EncoderOutputForm(BaseModelOutput, both)
    with pytest.raises(ValueError, match="takes BaseModelOutput with last_hidden_state, attentions"):
        greedy_encoder_outputs(model, state)
