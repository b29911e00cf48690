"""The `encoder_outputs` an encoder-decoder's decode step takes.

generate() passes what the model's encoder returned: its own ModelOutput class. Most models also take a tuple (their
forward wraps one in a BaseModelOutput), the simplest form a runtime builds, and the harness passes that where the
model takes it. Others read the fields by name (`encoder_outputs.last_hidden_state` in t5gemma, florence2, moonshine,
the Parakeet-encoder ASR models): they get the encoder's own output object, as generate() gives it. Which form a model
takes is found once per model, by running its forward on the tuple; the greedy loop builds the same form from the
forward program's `encoder_last_hidden_state`.
"""

from __future__ import annotations

import copy
import weakref
from dataclasses import dataclass

import torch
from torch.utils import _pytree as pytree


@dataclass(frozen=True)
class EncoderOutputForm:
    """The encoder's output class and its fields that hold values, or `cls` None for a tuple of the last state."""

    cls: type | None
    fields: tuple[str, ...] = ()


_FORMS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> its EncoderOutputForm


def encoder_output_capture(model: torch.nn.Module):
    """(a list that receives the outputs of `model`'s encoder, a hook handle to remove), or (None, None) when the model
    has no `get_encoder`."""
    encoder = model.get_encoder() if hasattr(model, "get_encoder") else None
    if not isinstance(encoder, torch.nn.Module) or encoder is model:
        return None, None
    captured: list = []
    return captured, encoder.register_forward_hook(lambda module, args, output: captured.append(output))


def decode_encoder_outputs(model: torch.nn.Module, encoder_output, inputs: dict):
    """The `encoder_outputs` of a decode step of `model` whose inputs are `inputs` (with a tuple of the encoder's last
    hidden state): that tuple when the model takes one, else a fresh copy of `encoder_output`, the object its encoder returned. Fresh
    contiguous tensors, as a runtime feeds them (a view makes export guard on the tensor it views)."""
    as_tuple = (inputs["encoder_outputs"][0].clone(memory_format=torch.contiguous_format),)
    form = _FORMS.get(model)
    if form is None:
        form = _FORMS[model] = _form(model, encoder_output, {**inputs, "encoder_outputs": as_tuple})
    if form.cls is None:
        return as_tuple
    return pytree.tree_map_only(
        torch.Tensor, lambda tensor: tensor.clone(memory_format=torch.contiguous_format), encoder_output
    )


def _form(model: torch.nn.Module, encoder_output, inputs: dict) -> EncoderOutputForm:
    if encoder_output is None or isinstance(encoder_output, tuple):
        return EncoderOutputForm(None)
    try:
        with torch.no_grad():
            model(**copy.deepcopy(inputs))  # the cache is updated in place: a copy
    except AttributeError as error:
        if "'tuple' object has no attribute" not in str(error):
            raise
        return EncoderOutputForm(type(encoder_output), tuple(encoder_output.keys()))
    return EncoderOutputForm(None)


def greedy_encoder_outputs(model: torch.nn.Module, last_hidden_state: torch.Tensor):
    """The decode program's `encoder_outputs` in a greedy loop, from the forward program's encoder last hidden state,
    in the form the harness found for `model` (`decode_encoder_outputs`)."""
    form = _FORMS.get(model, EncoderOutputForm(None))
    if form.cls is None:
        return (last_hidden_state,)
    if form.fields != ("last_hidden_state",):
        raise ValueError(
            f"the decode program takes {form.cls.__name__} with {', '.join(form.fields)}; the forward program returns "
            "only the encoder's last hidden state"
        )
    return form.cls(last_hidden_state=last_hidden_state)
