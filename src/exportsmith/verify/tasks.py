"""Which class of a model type to build, and seeded dummy inputs for one eager forward of it.

`model_class(model_type)` takes the first auto mapping of `PRIORITY_MAPPINGS` (causal LM, seq2seq LM, masked LM,
image-text-to-text, ..., base model), then of every other auto mapping by name, that has the model type; a type in
no mapping (a sub-model such as `siglip_text_model`) gets the model class of its modeling files whose
`config_class` is the type's config class. Refuses (LookupError) a type with neither; such a part of a model
(a mask decoder's config) is found in its container by `containing_model_type`. `config_for` picks the
sub-config a class is built from (a composite type's causal LM takes its text config).

`dummy_inputs(model)` reads the forward's parameters and the config, processor-free, like transformers' own tests:
text gets `input_ids` (+ `attention_mask`) drawn above the special token ids, encoder-decoders `decoder_input_ids`,
vision `pixel_values` of the config's size and channels (video clips, image pairs, LLaVA-NeXT tiles + `image_sizes`,
flattened patches + `image_grid_thw` for Qwen-style towers), audio `input_features`/`input_values` of the length
the config implies (in one of `AUDIO_LAYOUTS`), forecasters a history of `past_values`, video trackers an
inference session over a short clip with one prompt; a multimodal model gets every modality it has, with as many
placeholder tokens in `input_ids` as its `get_image_features`/`get_audio_features` return features, framed by the
config's start/end tokens. Refuses (ValueError) a model whose main input it cannot build.
"""

import importlib
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from transformers import PreTrainedModel
from transformers.models.auto import modeling_auto
from transformers.models.auto.configuration_auto import CONFIG_MAPPING, CONFIG_MAPPING_NAMES, model_type_to_module_name

from exportsmith.discover import torch_modeling_files
from exportsmith.verify.tiny import SPECIAL_IDS


@dataclass(frozen=True)
class InputShape:
    """The sizes dummy inputs are drawn at; media sizes (image size, audio frames) come from the config."""

    batch: int = 2
    text_length: int = 8
    decoder_length: int = 4
    seed: int = 0


# One eager forward and the export example: sizes >= 2 (export specialises 0 and 1).
EXAMPLE = InputShape()
AUDIO_SAMPLES = 3200  # 0.2 s at 16 kHz: longer than every conv feature extractor's receptive field
AUDIO_FRAMES = 64  # feature frames where the config does not fix their number


def audio_samples(shape: InputShape) -> int:
    """The samples of a model's own audio input at `shape`. A user's audio has any length, so the forward cases vary
    it with their text length (as a codec decoder's frames are its text length): AUDIO_SAMPLES at the shortest (text
    5), 4400 at the example (8), 5600 at the longest (11), the example between the others so that a guard on either
    side of it shows; less at the optional cases of 1 and 2 tokens (1600, 2000)."""
    return AUDIO_SAMPLES * (shape.text_length + 3) // 8


def audio_frames(shape: InputShape) -> int:
    """The feature frames of a model's own audio input at `shape` where the config does not fix them, likewise:
    AUDIO_FRAMES at the shortest forward case, 88 at the example, 112 at the longest."""
    return AUDIO_FRAMES * (shape.text_length + 3) // 8


PRIORITY_MAPPINGS = (
    ("causal-lm", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"),
    ("seq2seq-lm", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES"),
    ("masked-lm", "MODEL_FOR_MASKED_LM_MAPPING_NAMES"),
    ("image-text-to-text", "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES"),
    ("multimodal-lm", "MODEL_FOR_MULTIMODAL_LM_MAPPING_NAMES"),
    ("speech-seq2seq", "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES"),
    ("ctc", "MODEL_FOR_CTC_MAPPING_NAMES"),
    ("audio-classification", "MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES"),
    ("image-classification", "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES"),
    ("base", "MODEL_MAPPING_NAMES"),
)


def task_mappings() -> list[tuple[str, dict]]:
    """PRIORITY_MAPPINGS, then every other auto mapping of modeling_auto in name order."""
    named = [name for _, name in PRIORITY_MAPPINGS]
    others = sorted(name for name in dir(modeling_auto) if name.startswith("MODEL_FOR_") and name.endswith("_NAMES"))
    # A mapping may not exist in the installed transformers (4.x has no multimodal-LM mapping): skip it
    tasks = [(task, getattr(modeling_auto, name)) for task, name in PRIORITY_MAPPINGS if hasattr(modeling_auto, name)]
    for name in others:
        if name not in named:
            tasks.append(
                (name.removeprefix("MODEL_FOR_").removesuffix("_MAPPING_NAMES").lower(), getattr(modeling_auto, name))
            )
    return tasks


ENCODER_MAPPINGS = (
    set(modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES)
    | set(modeling_auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES)
    | set(modeling_auto.MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES)
)


# How the harness says a configuration type has no model class of its own (coverage counts such types apart)
NO_MODEL_CLASS = "no model class for"


def model_class(model_type: str) -> tuple[str, type]:
    """(task, class) to build for `model_type`."""
    for task, mapping in task_mappings():
        if task == "causal-lm" and model_type in ENCODER_MAPPINGS:
            continue  # encoders (bert, ...), bart-likes, whisper: their causal-LM head is an add-on, not the model
        name = mapping.get(model_type)
        if isinstance(name, (list, tuple)):
            name = name[0]
        if name:
            if hasattr(transformers, name):
                return task, getattr(transformers, name)
            break  # a mapping entry that transformers does not export: look in the modeling files
    return "config-class", class_of_config(model_type)


def class_of_config(model_type: str) -> type:
    """The model class of the type's modeling files whose config_class is the type's config (`...Model` first)."""
    config_class = CONFIG_MAPPING[model_type]
    module = model_type_to_module_name(model_type)
    folder = Path(transformers.__file__).parent / "models" / module
    candidates = []
    for path in torch_modeling_files(folder):
        modeling = importlib.import_module(f"transformers.models.{module}.{path.stem}")
        for _, candidate in inspect.getmembers(modeling, inspect.isclass):
            if (
                candidate.__module__ == modeling.__name__
                and issubclass(candidate, PreTrainedModel)
                and candidate.config_class is config_class
            ):
                candidates.append(candidate)
    if not candidates:
        raise LookupError(f"{NO_MODEL_CLASS} {config_class.__name__} in the auto mappings or its modeling files")
    # The plain `...Model` over heads; never the abstract `...PreTrainedModel`.
    return min(
        candidates,
        key=lambda cls: (
            "PreTrained" in cls.__name__,
            not cls.__name__.endswith("Model"),
            len(cls.__name__),
            cls.__name__,
        ),
    )


def containing_model_type(model_type: str) -> str | None:
    """The model type whose config holds `model_type`'s config as a sub-config (SAM's mask decoder -> sam), for a
    part of a model that has no model class of its own: it is built and run inside its container. None if no
    other config holds it. Types whose name starts the part's name are tried first, longest first (loading every
    config class takes seconds), then the others by name."""
    config_class = CONFIG_MAPPING[model_type]
    prefixes = sorted((name for name in CONFIG_MAPPING_NAMES if model_type.startswith(name)), key=len, reverse=True)
    for container in prefixes + sorted(CONFIG_MAPPING_NAMES):
        if container == model_type:
            continue
        sub_configs = getattr(CONFIG_MAPPING[container], "sub_configs", None) or {}
        if any(sub is config_class for sub in sub_configs.values()):
            return container
    return None


def config_for(model_class: type, config):
    """`config`, or its sub-config that `model_class` is built from (a composite type's causal LM takes the text
    config, as `AutoModelForCausalLM.from_config` does)."""
    wanted = getattr(model_class, "config_class", None)
    if wanted is None or isinstance(config, wanted):
        return config
    for name in getattr(config, "sub_configs", {}):
        sub = getattr(config, name, None)
        if isinstance(sub, wanted):
            return sub
    return config


def has_forward(model: torch.nn.Module) -> bool:
    """Whether the model defines a forward (a VQ tokenizer may only define encode/decode)."""
    return type(model).forward is not torch.nn.Module.forward


def forward_parameters(model: torch.nn.Module) -> list[str]:
    return [name for name in inspect.signature(model.forward).parameters if name not in ("args", "kwargs")]


def required_parameters(model: torch.nn.Module) -> list[str]:
    signature = inspect.signature(model.forward).parameters.values()
    return [parameter.name for parameter in signature if parameter.default is inspect.Parameter.empty]


# Parts that take their container's time conditioning through **kwargs (not in their signature).
TIME_CONDITIONED = ("voxtral_realtime_text",)
# Parts whose container embeds their tokens (Qwen3-Omni's talker and its code predictor sum codec, text and
# hidden-state embeddings first): they take `inputs_embeds`, their `input_ids` are refused or never embedded.
EMBEDDED_BY_CONTAINER = ("qwen3_omni_moe_talker_text", "qwen3_omni_moe_talker_code_predictor")


def main_input(model: torch.nn.Module, parameters: list[str]) -> str:
    """`main_input_name` where the forward takes it; else the forward's first parameter (sub-models such as vision
    towers often keep the inherited "input_ids"). A generic `inputs` that the forward also takes under a specific
    name (Perceiver's `input_ids`, a speech encoder-decoder's encoder input) is given under that name."""
    if model.config.model_type in EMBEDDED_BY_CONTAINER:
        return "inputs_embeds"
    main = model.main_input_name if model.main_input_name in parameters else parameters[0]
    if main == "inputs":
        encoder = getattr(model, "encoder", None)
        aliases = (getattr(encoder, "main_input_name", None), "input_ids")
        return next((alias for alias in aliases if alias in parameters and alias != "inputs"), main)
    return main


def takes_audio(model: torch.nn.Module) -> bool:
    return bool({"input_features", "input_values"} & set(forward_parameters(model)))


def dummy_inputs(model: torch.nn.Module, audio_layout: int = 0, shape: InputShape = EXAMPLE) -> dict:
    """Keyword arguments for one eager forward of `model` at `shape` (seeded, deterministic); see AUDIO_LAYOUTS."""
    generator = torch.Generator().manual_seed(shape.seed)
    config, ordered = model.config, forward_parameters(model)
    parameters, main = set(ordered), main_input(model, ordered)
    inputs = {}
    # Every modality the model has: its main input, a placeholder token for it, or a sub-config for its encoder.
    # A tower whose sub-config is left out (None: a text-only checkpoint of a multimodal family) is not built.
    wants_images = main == "pixel_values_videos" or (
        "pixel_values" in parameters
        and (
            main == "pixel_values"
            or has_image_token(config)
            or hasattr(config, "vision_config")
            or images_in_config(config)
        )
        and not tower_left_out(config, "vision_config", main)
    )
    wants_audio = (
        bool({"input_features", "input_values"} & parameters)
        and (
            main in ("input_features", "input_values")
            or has_audio_token(config)
            or (hasattr(config, "audio_config") and not unset_placeholder(config, MODALITIES[1]))
            or hasattr(config, "speech_config")  # CLVP: text and speech, whose decoder conditions on features
        )
        and not tower_left_out(config, "audio_config", main)
    )
    if main == "hidden_states" and "grid_thw" in parameters:  # a Qwen-style vision tower on its own
        inputs.update(patch_inputs(model, config, "hidden_states", "grid_thw", shape, generator, varied=True))
    elif {"quantized_code", "condition_vector", "speaker_embedding"} <= parameters:
        # a code-to-mel diffusion transformer (Qwen2.5-Omni's token2wav DiT), one step: codec codes, each repeated
        # into `repeats` mel frames, the noisy mel at those frames, a reference mel for its speaker encoder, the
        # speaker embedding per frame, and the step's time
        codes = (shape.batch, shape.text_length)
        frames = shape.text_length * config.repeats
        inputs["quantized_code"] = torch.randint(0, config.num_embeds, codes, generator=generator)
        inputs[main] = torch.randn((shape.batch, frames, config.mel_dim), generator=generator)
        inputs["condition_vector"] = torch.randn((shape.batch, AUDIO_FRAMES, config.mel_dim), generator=generator)
        embedding = (shape.batch, frames, config.enc_emb_dim)
        inputs["speaker_embedding"] = torch.randn(embedding, generator=generator)
        inputs["time_step"] = torch.rand((shape.batch,), generator=generator)
    elif main == "latents" or codec_part(model, main) == "decoder":  # a codec's decoder: (batch, width, frames)
        width = first_int(config, ("hidden_size",), 64)
        inputs[main] = torch.randn((shape.batch, width, shape.text_length), generator=generator)
    elif codec_part(model, main) == "encoder":  # raw audio under another name: (batch, channels, samples)
        channels = first_int(config, ("channels", "audio_channels"), 1)
        inputs[main] = torch.randn((shape.batch, channels, audio_samples(shape)), generator=generator)
    elif main == "image" or (main == "hidden_states" and model.main_input_name == "pixel_values"):
        # pixels under another name: BridgeTower's vision tower's `image`, Florence 2's backbone's `hidden_states`
        channels, height, width = image_size(config)
        inputs[main] = torch.randn((shape.batch, channels, height, width), generator=generator)
    elif {"noise", "timestep"} <= parameters and hasattr(config, "vlm_config") and hasattr(config, "chunk_size"):
        # a flow-matching robot policy (PI0, PI0.5): the robot's state (PI0 takes it apart, PI0.5 in its prompt), and
        # one denoising step of an action chunk (its noise and the step's time in (0, 1), given rather than sampled
        # so that the run is deterministic), after the prompt: camera images and text
        if "state" in parameters and hasattr(config, "max_state_dim"):
            inputs["state"] = torch.randn((shape.batch, config.max_state_dim), generator=generator)
        noise = (shape.batch, config.chunk_size, config.max_action_dim)
        inputs["noise"] = torch.randn(noise, generator=generator)
        inputs["timestep"] = torch.rand((shape.batch,), generator=generator)
        inputs.update(camera_prompt_inputs(config.vlm_config, shape, generator))
    elif main == "states":  # Decision Transformer: a trajectory of states, actions, returns to go, rewards
        inputs.update(trajectory_inputs(config, shape, generator))
    elif main == "audio_mel":  # Gemma 3n's audio encoder: (batch, frames, mel bins) and which frames are padding
        bins = first_int(config, ("input_feat_size",), 128)
        inputs[main] = torch.randn((shape.batch, audio_frames(shape), bins), generator=generator)
        inputs["audio_mel_mask"] = torch.zeros((shape.batch, audio_frames(shape)), dtype=torch.bool)
    elif main == "flattened_patches":  # Pix2Struct: each patch's (row, column) from 1, then its pixels
        inputs.update(numbered_patches(sub_config(config, "vision_config"), shape, generator))
    elif main in EMBEDDING_INPUTS:  # a stack that takes embeddings (or stacked audio features)
        width = first_int(config, ("input_dim", "input_size", "hidden_size", "d_model", "embed_dim"), 64)
        inputs[main] = torch.randn((shape.batch, shape.text_length, width), generator=generator)
    elif main == "mel_spectrogram":  # a vocoder over (batch, mel bins, frames)
        bins = first_int(config, ("mel_dim", "num_mel_bins"), 80)
        inputs[main] = torch.randn((shape.batch, bins, audio_frames(shape)), generator=generator)
    elif main == "past_values":  # a time series forecaster
        inputs.update(time_series_inputs(config, parameters, shape, generator))
    elif "shared_kv_states" in parameters and hasattr(config, "backbone_hidden_size"):
        inputs.update(drafter_inputs(config, shape, generator))
    elif main == "noise_embeds" and "context_hidden_states" in parameters:
        # a block-diffusion drafter (Muse Glimmer's): a block of embeddings to denoise, and the target model's
        # hidden states at its tapped layers (concatenated) over the tokens accepted so far
        width = config.hidden_size
        inputs[main] = torch.randn((shape.batch, config.block_size, width), generator=generator)
        context = (shape.batch, shape.text_length, width * len(config.target_layer_ids))
        inputs["context_hidden_states"] = torch.randn(context, generator=generator)
        # keys and values span the context and the block
        inputs["attention_mask"] = torch.ones((shape.batch, shape.text_length + config.block_size), dtype=torch.long)
    elif main == "inference_session":  # a video tracker: a session holding a short clip and one prompted object
        inputs.update(video_session_inputs(model, config, shape, generator))
    elif main == "spectrogram":  # a vocoder
        bins = first_int(config, ("model_in_dim", "num_mel_bins"), 80)
        inputs[main] = torch.randn((shape.batch, audio_frames(shape), bins), generator=generator)
    elif wants_images:
        inputs.update(image_inputs(model, config, parameters, shape, generator))
    if "image_token_pooling" in parameters and "pixel_values" in inputs:
        inputs.update(pooled_crop_inputs(inputs["pixel_values"]))
    if "high_res_pixel_values" in parameters and "pixel_values" in inputs:
        # DeepSeek-VL hybrid: the same images for its high-resolution tower too, at that tower's size
        channels, height, width = image_size(sub_config(config, "high_res_vision_config"))
        size = (shape.batch, channels, height, width)
        inputs["high_res_pixel_values"] = torch.randn(size, generator=generator)
    if wants_audio:
        inputs.update(audio_inputs(config, parameters, main, audio_layout, shape, generator))
        for mask in AUDIO_MASKS:
            if mask in inputs and feature_owner(model, "get_audio_features") and not feature_method_names(model, mask):
                # a mask the audio features do not count with is over their projected tokens (Granite Speech's)
                # rather than over frames: left out, it keeps them all
                del inputs[mask]
        if "padding_mask" in parameters and feature_method_requires(model, "get_audio_features", "padding_mask"):
            # which samples of the raw audio are real (all of them), where the audio features need it
            audio = inputs.get("input_values", next(iter(inputs.values())))
            inputs["padding_mask"] = torch.ones((shape.batch, audio.shape[-1]), dtype=torch.long)
    if {"input_values", "input_features"} <= set(required_parameters(model)):
        # a codec with a semantic encoder beside its acoustic one (NeuCodec, X-Codec 2): raw audio (batch, 1,
        # samples) and the semantic encoder's features of the same audio, (batch, frames, bins) at its 50 Hz
        semantic = sub_config(config, "semantic_model_config")
        bins = first_int(semantic, FEATURE_BINS, 80)
        frames = audio_samples(shape) // 320
        inputs["input_values"] = torch.randn((shape.batch, 1, frames * 320), generator=generator)
        inputs["input_features"] = torch.randn((shape.batch, frames, bins), generator=generator)
        inputs.pop("padding_mask", None)  # optional; all real
        if "input_features_mask" in inputs:
            inputs["input_features_mask"] = torch.ones((shape.batch, frames), dtype=torch.long)
    # A second text input (a Q-Former's prompt, ...) before the main one: image features may depend on it.
    for name in required_parameters(model):
        if name.endswith("_input_ids") and name not in inputs:
            prefix = name.removesuffix("_input_ids")
            if isinstance(getattr(config, "mel_vocab_size", None), int):
                # quantized mel frames (Inkling's audio tower): (batch, frames, mel bins), one level per bin
                size = (shape.batch, shape.text_length, config.n_mel_bins)
                inputs[name] = torch.randint(0, config.mel_vocab_size, size, generator=generator)
                continue
            inputs[name] = random_tokens(
                vocab(sub_config(config, f"{prefix}_config", "text_config")),
                (shape.batch, shape.text_length),
                generator,
            )
    if "input_ids" in parameters and main != "inputs_embeds" and "input_ids" not in inputs:
        inputs.update(text_inputs(model, config, parameters, inputs, shape, generator))
    if "encoder_hidden_states" in parameters and type(model).__name__.endswith("Decoder") and main == "input_ids":
        # the decoder of an encoder-decoder built on its own cross-attends to encoder states
        width = first_int(config, ("hidden_size", "d_model"), 64)
        inputs["encoder_hidden_states"] = torch.randn((shape.batch, shape.text_length, width), generator=generator)
    elif "encoder_hidden_states" in parameters and main == "query_embeds":
        # a Q-Former on its own: its queries cross-attend to image features of the encoder's width
        width = first_int(config, ("encoder_hidden_size", "hidden_size"), 64)
        inputs["encoder_hidden_states"] = torch.randn((shape.batch, shape.text_length, width), generator=generator)
    if "task_inputs" in required_parameters(model):  # OneFormer: the tokenized task prompt, padded to its length
        length = first_int(config, ("task_seq_len",), shape.text_length)
        vocab_size = first_int(config, ("text_encoder_vocab_size",), 128)
        inputs["task_inputs"] = random_tokens(vocab_size, (shape.batch, length), generator)
    if main == "inputs_embeds" and "num_patches" in required_parameters(model):
        inputs["num_patches"] = shape.text_length // 2  # DeepSeek-OCR 2: image tokens first, then the queries
    if main in EMBEDDING_INPUTS and "attention_mask" in required_parameters(model):
        inputs["attention_mask"] = torch.ones(inputs[main].shape[:2], dtype=torch.long)
    if "visual_feats" in parameters:  # LXMERT: detected regions' features and boxes (x0, y0, x1, y1 in 0..1)
        boxes = 4
        inputs["visual_feats"] = torch.randn((shape.batch, boxes, config.visual_feat_dim), generator=generator)
        corners = torch.rand((shape.batch, boxes, 2, 2), generator=generator).sort(dim=-2).values
        inputs["visual_pos"] = corners.flatten(-2)[..., : config.visual_pos_dim]
    if "decoder_input_ids" in parameters and getattr(config, "is_encoder_decoder", False):
        size = (shape.batch, shape.decoder_length) + code_channels(sub_config(config, "decoder_config"))
        inputs["decoder_input_ids"] = random_tokens(decoder_vocab(config), size, generator)
    if "classes_structure" in parameters:  # OmDet-Turbo: each image's class prompts flattened, and its task prompt
        classes = 2
        text = vocab(config)
        for name, rows in (("classes", shape.batch * classes), ("tasks", shape.batch)):
            inputs[f"{name}_input_ids"] = random_tokens(text, (rows, shape.text_length), generator)
            inputs[f"{name}_attention_mask"] = torch.ones((rows, shape.text_length), dtype=torch.long)
        inputs["classes_structure"] = torch.full((shape.batch,), classes)
    if {"marks", "num_options", "question_type_ids"} <= parameters:
        # a decision head over one prompt (JEV): the positions (from 1) of the tokens that mark its questions, each
        # question's option count and type
        questions = 2
        inputs["marks"] = torch.tensor([[shape.text_length // 2, shape.text_length]])
        inputs["num_options"] = torch.full((1, questions), 2)
        inputs["question_type_ids"] = torch.zeros((1, questions), dtype=torch.long)
        inputs["input_ids"] = inputs["input_ids"][:1]
    if {"context_input_ids", "context_attention_mask", "doc_scores"} <= parameters:
        # retrieval-augmented generation without a retriever (RAG): the retrieved documents, each joined to its
        # question as the generator's input, and their retrieval scores
        docs = config.n_docs
        generator_vocab = first_int(sub_config(config, "generator"), ("vocab_size",), 128)
        rows = (shape.batch * docs, shape.text_length)
        inputs["context_input_ids"] = random_tokens(generator_vocab, rows, generator)
        inputs["context_attention_mask"] = torch.ones(rows, dtype=torch.long)
        inputs["doc_scores"] = torch.randn((shape.batch, docs), generator=generator)
    if config.model_type in TIME_CONDITIONED:
        # the text model of Voxtral Realtime, on its own: the container's embedding of the delay (in tokens) that
        # its layers' adaptive norms take as `t_cond`, broadcast over the batch
        inputs["t_cond"] = torch.randn((1, config.hidden_size), generator=generator)
    if "last_hidden_state" in parameters and main == "input_ids":
        # a depth decoder (Moshi's) over a main decoder's states: one per token, of the main decoder's width
        width = first_int(config, ("input_size",), 64)
        inputs["last_hidden_state"] = torch.randn((*inputs["input_ids"].shape[:2], width), generator=generator)
    if "input_values_cutoffs" in parameters and "input_values" in inputs:
        # where each sample's audio ends among its samples (CSM): one codec frame's worth, which its one audio
        # placeholder stands for
        codec = sub_config(config, "codec_config")
        frame = int(codec.sampling_rate / codec.frame_rate)
        inputs["input_values_cutoffs"] = torch.full((shape.batch, 1), min(frame, inputs["input_values"].shape[-1]))
    if "chunk_sample_lengths" in required_parameters(model) and "input_features" in inputs:
        # audio cut into chunks (Dots3 Note's encoder): each chunk's samples, all of its (batch, bins, frames) real
        hop = first_int(config, ("hop_length",), 160)
        features = inputs["input_features"]
        inputs["chunk_sample_lengths"] = torch.full((features.shape[0],), features.shape[-1] * hop)
    for name in required_parameters(model):
        if name not in inputs and accepts_none(model, name):
            inputs[name] = None  # required but optional by type (Phi-4's audio mask): none, as the signature allows
    if main not in inputs:
        raise ValueError(f"cannot build the main input {main!r} of {type(model).__name__}")
    return inputs


def accepts_none(model: torch.nn.Module, name: str) -> bool:
    """Whether the forward's annotation of `name` includes None (`X | None`, `Optional[X]`)."""
    annotation = inspect.signature(model.forward).parameters[name].annotation
    return annotation is not inspect.Parameter.empty and type(None) in getattr(annotation, "__args__", ())


# Main inputs that are a sequence of vectors of the model's width, (batch, length, width): a stack's embeddings, a
# Q-Former's queries, a perceiver resampler's context.
EMBEDDING_INPUTS = ("hidden_states", "inputs_embeds", "query_embeds", "context")


def pooled_crop_inputs(pixel_values: torch.Tensor, pool: int = 2) -> dict:
    """Molmo 2's pooling of each image (one crop of a square patch grid) into one text token per pool x pool patches:
    the patches (indices into every crop's patches, flattened) each token pools, and each image's grid of tokens
    (rows and columns of its high-resolution crops, then of its low-resolution one: none)."""
    images, patches = pixel_values.shape[:2]
    side = int(patches**0.5)
    tokens = side // pool
    row, column = torch.meshgrid(torch.arange(tokens), torch.arange(tokens), indexing="ij")
    offset_row, offset_column = torch.meshgrid(torch.arange(pool), torch.arange(pool), indexing="ij")
    rows = (row.reshape(-1, 1) * pool + offset_row.reshape(1, -1)) * side
    within = rows + column.reshape(-1, 1) * pool + offset_column.reshape(1, -1)
    pooling = torch.cat([within + image * patches for image in range(images)])
    grids = torch.tensor([[tokens, tokens, 0, 0]] * images)
    return {"image_token_pooling": pooling, "image_grids": grids}


def camera_prompt_inputs(vlm, shape: InputShape, generator: torch.Generator) -> dict:
    """A policy's prompt (PI0): one camera image per sample (batch, cameras, C, H, W) and which cameras are real, and
    the text led by one image token per patch of it."""
    channels, height, width = image_size(vlm.vision_config)
    patch = first_int(vlm.vision_config, ("patch_size",), 14)
    image_tokens = torch.full((shape.batch, (height // patch) * (width // patch)), vlm.image_token_id)
    input_ids = torch.cat([image_tokens, random_tokens(vocab(vlm), (shape.batch, shape.text_length), generator)], 1)
    return {
        "pixel_values": torch.randn((shape.batch, 1, channels, height, width), generator=generator),
        "pixel_attention_mask": torch.ones((shape.batch, 1), dtype=torch.bool),
        "input_ids": input_ids,
        "attention_mask": torch.ones_like(input_ids),
    }


def trajectory_inputs(config, shape: InputShape, generator: torch.Generator) -> dict:
    size = (shape.batch, shape.text_length)
    return {
        "states": torch.randn((*size, config.state_dim), generator=generator),
        "actions": torch.randn((*size, config.act_dim), generator=generator),
        "rewards": torch.randn((*size, 1), generator=generator),
        "returns_to_go": torch.randn((*size, 1), generator=generator),
        "timesteps": torch.arange(shape.text_length).expand(size),
        "attention_mask": torch.ones(size, dtype=torch.long),
    }


def drafter_inputs(config, shape: InputShape, generator: torch.Generator) -> dict:
    """A drafting step of a drafter that runs on its target model's states (Gemma 4's assistant), as `generate`
    makes one: the last token's embedding beside the target's last hidden state (2 x the target's width), and the
    keys and values of the target's last layer of each kind, (batch, kv heads, target length, head dim), which every
    drafter layer of that kind attends to."""
    text = config.get_text_config()
    width = 2 * config.backbone_hidden_size
    inputs = {"inputs_embeds": torch.randn((shape.batch, 1, width), generator=generator)}
    per_layer = getattr(text, "per_layer_config", None)
    states = {}
    for index, kind in enumerate(text.layer_types):  # the last layer of a kind wins
        layer = per_layer[index] if per_layer is not None else text
        size = (shape.batch, layer.num_key_value_heads, shape.text_length, layer.head_dim)
        states[kind] = (torch.randn(size, generator=generator), torch.randn(size, generator=generator))
    inputs["shared_kv_states"] = states
    return inputs


VIDEO_FRAMES = 2


def video_session_inputs(model, config, shape: InputShape, generator: torch.Generator) -> dict:
    """A video tracker's inputs, as its processor's `init_video_session` and prompt methods leave them: a session
    (the class the forward annotates) over a clip of VIDEO_FRAMES frames, and on frame 0 one object prompted by a
    point (trackers) or one text prompt (SAM 3 video, which detects what the text names), tokenized to the text
    tower's vocabulary."""
    session_class = inspect.signature(type(model).forward).parameters["inference_session"].annotation
    channels, height, width = image_size(vision_config(config))
    video = torch.randn((VIDEO_FRAMES, channels, height, width), generator=generator)
    session = session_class(video=video, video_height=height, video_width=width, dtype=torch.float32)
    if hasattr(session, "add_prompt"):
        prompt_id = session.add_prompt("object")
        text = sub_config(config, "detector_config")
        session.prompt_input_ids[prompt_id] = random_tokens(vocab(text), (1, shape.text_length), generator)
        session.prompt_attention_masks[prompt_id] = torch.ones((1, shape.text_length), dtype=torch.long)
    else:
        obj_id = 1
        obj_idx = session.obj_id_to_idx(obj_id)
        # a point in the middle of the frame, a positive click (label 1), as (frame, objects, points, xy)
        point = torch.tensor([[[[width / 2, height / 2]]]])
        session.add_point_inputs(
            obj_idx, 0, {"point_coords": point, "point_labels": torch.ones((1, 1, 1), dtype=torch.int32)}
        )
        session.obj_with_new_inputs = [obj_id]
    return {"inference_session": session, "frame_idx": 0}


def numbered_patches(vision, shape: InputShape, generator: torch.Generator, side: int = 4) -> dict:
    """A side x side grid of flattened patches, each prefixed by its row and column (counted from 1), all real."""
    width = first_int(vision, ("patch_embed_hidden_size",), 64)
    rows = torch.arange(1, side + 1).repeat_interleave(side).float()
    columns = torch.arange(1, side + 1).repeat(side).float()
    positions = torch.stack([rows, columns], -1).expand(shape.batch, -1, -1)
    pixels = torch.randn((shape.batch, side * side, width), generator=generator)
    return {
        "flattened_patches": torch.cat([positions, pixels], -1),
        "attention_mask": torch.ones((shape.batch, side * side), dtype=torch.long),
    }


def codec_part(model: torch.nn.Module, main: str) -> str | None:
    """ "encoder" or "decoder" for half of an audio codec built on its own: it declares raw audio as its main input
    (`input_values`) but its forward takes `hidden_states` (VibeVoice's tokenizer halves); None otherwise."""
    if main != "hidden_states" or model.main_input_name != "input_values":
        return None
    return "decoder" if type(model).__name__.endswith(("DecoderModel", "Decoder")) else "encoder"


def time_series_inputs(config, parameters: set[str], shape: InputShape, generator: torch.Generator) -> dict:
    """A history of `context_length` steps (plus the largest lag the model looks back to): one value per step, or
    one per channel (`num_input_channels`), with its observed mask, time features, and padding."""
    lags = getattr(config, "lags_sequence", None) or [0]
    length = first_int(config, ("context_length",), 16) + max(lags)
    channels = first_int(config, ("num_input_channels",), None)
    size = (shape.batch, length) if channels is None else (shape.batch, length, channels)
    inputs = {"past_values": torch.randn(size, generator=generator)}
    if "past_observed_mask" in parameters:
        inputs["past_observed_mask"] = torch.ones(size)
    if "past_time_features" in parameters:
        features = first_int(config, ("num_time_features",), 0) + first_int(config, ("num_dynamic_real_features",), 0)
        inputs["past_time_features"] = torch.randn((shape.batch, length, features), generator=generator)
    if "past_values_padding" in parameters:
        inputs["past_values_padding"] = torch.zeros((shape.batch, length))
    if "freq" in parameters:  # a frequency category per series (0: high frequency)
        inputs["freq"] = torch.zeros((shape.batch, 1), dtype=torch.long)
    return inputs


def images_in_config(config) -> bool:
    """A single config that also sizes images (ViLT's image size, TVP's largest frame)."""
    return isinstance(getattr(config, "image_size", None), int) or isinstance(
        getattr(config, "max_img_size", None), int
    )


def tower_left_out(config, name: str, main: str) -> bool:
    """The config has the tower's sub-config slot but leaves it empty, and the tower's input is not the main one."""
    return (
        name in getattr(config, "sub_configs", {})
        and getattr(config, name, None) is None
        and main != ("pixel_values" if name == "vision_config" else "input_features")
    )


def sub_config(config, *names):
    for name in names:
        sub = getattr(config, name, None)
        if sub is not None and not isinstance(sub, (int, float, str, bool, list, dict)):
            return sub
    return config


def first_int(config, names, default):
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return default


def vocab(config) -> int:
    text = sub_config(config, "text_config", "decoder", "language_config", "llm_config", "model_config")
    return first_int(text, ("vocab_size",), None) or first_int(config, ("vocab_size",), 128)


def decoder_vocab(config) -> int:
    decoder = sub_config(config, "decoder", "decoder_config", "text_config")
    return first_int(decoder, ("vocab_size",), None) or vocab(config)


def random_tokens(vocab_size: int, shape: tuple, generator: torch.Generator) -> torch.Tensor:
    """Token ids above the special ids (see tiny.SPECIAL_IDS) where the vocabulary has room for them."""
    low = SPECIAL_IDS if vocab_size > 2 * SPECIAL_IDS else 0
    return torch.randint(low, vocab_size, shape, generator=generator)


def token_id(config, *names):
    """The first of `names` set on the config or its text config."""
    for holder in (config, sub_config(config, "text_config")):
        for name in names:
            value = getattr(holder, name, None)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
    return None


def unset_placeholder(config, modality: "Modality") -> bool:
    """The config has a placeholder token for the modality but leaves it unset (a processor sets it): features could
    not be placed in the text."""
    holders = (config, sub_config(config, "text_config"))
    names = [name for holder in holders for name in modality.placeholder if hasattr(holder, name)]
    return bool(names) and token_id(config, *modality.placeholder) is None


def has_image_token(config) -> bool:
    return token_id(config, "image_token_id", "image_token_index") is not None


def has_audio_token(config) -> bool:
    return token_id(config, "audio_token_id", "audio_token_index") is not None


def vision_config(config):
    return sub_config(config, "vision_config", "vision_encoder_config", "encoder")


# Image sizes that a config does not give and the default 32 x 32 is too small for: OCR text-line recognizers
# pool their last feature map by 3 x 2 after striding the height by up to 32.
IMAGE_SIZES = {
    # TVP's ResNet halves a frame five times, then max-pools: 64 leaves it a 2 x 2 map
    "tvp": (64, 64),
    # UVDoc's dilated bridge convolutions reflect-pad by 2 its feature map, stride 16: at least 4 x 4
    "uvdoc": (64, 64),
    "pp_ocrv5_mobile_rec": (96, 64),
    "pp_ocrv5_server_rec": (96, 64),
    "pp_ocrv6_small_rec": (96, 64),
    "pp_ocrv6_tiny_rec": (96, 64),
}


def image_size(vision) -> tuple[int, int, int]:
    """(channels, height, width) of one image."""
    channels = first_int(vision, ("num_channels", "in_channels", "in_chans", "input_channels"), 3)
    size = getattr(vision, "image_size", None) or IMAGE_SIZES.get(getattr(vision, "model_type", None)) or 32
    height, width = (size, size) if isinstance(size, int) else tuple(size)[-2:]
    return channels, height, width


def image_inputs(model, config, parameters: set[str], shape: InputShape, generator: torch.Generator) -> dict:
    batch = shape.batch
    for grid_name in ("image_grid_thw", "grid_thw", "image_grid_hw"):
        # an image-only grid only where the image features need it: RADIO takes it optionally beside whole images
        optional = grid_name == "image_grid_hw" and not feature_method_requires(model, "get_image_features", grid_name)
        if grid_name in parameters and not optional:
            inputs = patch_inputs(model, config, "pixel_values", grid_name, shape, generator)
            for merge_name in {"merge_sizes", "image_merge_sizes"} & parameters:
                # the processor's choice of patches merged per side: 1 (none), which every grid allows
                inputs[merge_name] = torch.ones(shape.batch, dtype=torch.long)
            return inputs
    vision = vision_config(config)
    channels, height, width = image_size(vision)
    patch = first_int(vision, ("patch_size",), None)
    if getattr(vision, "model_type", None) in PATCH_CUBES:
        # each patch a (frames, patch, patch, channels) cube, every image's patches one after the other
        frames = first_int(vision, ("temporal_patch_size",), 1)
        count = batch * (height // patch) * (width // patch)
        return {"pixel_values": torch.randn((count, frames, patch, patch, channels), generator=generator)}
    flat = FLAT_PATCH_INPUTS & parameters or config.model_type in FLAT_PATCH_TOWERS
    if patch and flat and embeds_flat_patches(model, channels * patch * patch):
        inputs = flat_patch_inputs(parameters, batch, channels, patch, height // patch, width // patch, generator)
        if config.model_type in PACKED_FLAT_PATCHES:  # every image's patches one after the other, no batch axis
            inputs["pixel_values"] = inputs["pixel_values"].flatten(0, 1)
        return inputs
    if "prompt_masks" in parameters:  # SegGPT: image and prompt (with its mask), each half the canvas they make up
        canvas = (batch, channels, height // 2, width)
        return {
            name: torch.randn(canvas, generator=generator)
            for name in ("pixel_values", "prompt_pixel_values", "prompt_masks")
        }
    if "aspect_ratio_ids" in parameters:  # Mllama: one image per sample, padded to its tiles
        tiles = first_int(vision, ("max_num_tiles",), 1)
        mask = torch.zeros((batch, 1, tiles), dtype=torch.long)
        mask[..., 0] = 1  # one real tile: the 1 x 1 aspect ratio, the first supported one (ids count from 1)
        return {
            "pixel_values": torch.randn((batch, 1, tiles, channels, height, width), generator=generator),
            "aspect_ratio_ids": torch.ones((batch, 1), dtype=torch.long),
            "aspect_ratio_mask": mask,
        }
    if patch and "target_sizes" in parameters:  # MiniCPM-V: every image's patches side by side in one strip
        rows, columns = height // patch, width // patch
        strip = torch.randn((1, channels, patch, batch * rows * columns * patch), generator=generator)
        return {"pixel_values": strip, "target_sizes": torch.tensor([[rows, columns]] * batch)}
    frames = first_int(vision, ("num_frames", "frames_per_clip"), None) or first_int(config, ("num_frames",), None)
    frames = frames or CLIP_FRAMES.get(config.model_type)
    if "pixel_values_videos" in parameters and "pixel_values" not in parameters:
        return {"pixel_values_videos": torch.randn((batch, frames or 4, channels, height, width), generator=generator)}
    if frames and config.model_type in FRAMES_IN_BATCH:
        return {"pixel_values": torch.randn((batch * frames, channels, height, width), generator=generator)}
    if frames:  # video classifiers take clips in pixel_values
        return {"pixel_values": torch.randn((batch, frames, channels, height, width), generator=generator)}
    if (
        config.model_type in modeling_auto.MODEL_FOR_KEYPOINT_MATCHING_MAPPING_NAMES
    ):  # image pairs, also for the base model
        return {"pixel_values": torch.randn((batch, 2, channels, height, width), generator=generator)}
    if "image_attention_mask" in parameters:  # IDEFICS: a list of images per sample (one), text tokens see them
        return {"pixel_values": torch.randn((batch, 1, channels, height, width), generator=generator)}
    if "pixel_attention_mask" in parameters:  # Idefics-style: a list of images per sample, and which pixels are real
        return {
            "pixel_values": torch.randn((batch, 1, channels, height, width), generator=generator),
            # which pixels are real; Granite Docling's mask says which tiles are
            "pixel_attention_mask": torch.ones(
                (batch, 1) if config.model_type in TILE_MASKS else (batch, 1, height, width), dtype=torch.bool
            ),
        }
    pixels = (batch, channels, height, width)
    if not requires_image_sizes(model):
        return {"pixel_values": torch.randn(pixels, generator=generator)}
    sizes = torch.tensor([[height, width]] * batch)
    if getattr(config, "image_grid_pinpoints", None):  # LLaVA-NeXT tiles: the model's own helper says how many
        tiles = sys.modules[type(model).__module__].image_size_to_num_patches(
            (height, width), config.image_grid_pinpoints, height
        )
        pixels = (batch, tiles, channels, height, width)
    return {"pixel_values": torch.randn(pixels, generator=generator), "image_sizes": sizes}


# Towers that take every patch as a channels-last cube of its frames (Inkling's), by vision config type.
PATCH_CUBES = ("inkling_vision",)
# Video models whose configs do not say how many frames a clip has (InstructBLIP-Video: always 4).
CLIP_FRAMES = {"instructblipvideo": 4}
# Idefics-style models whose pixel_attention_mask marks real tiles (batch, tiles), not real pixels.
TILE_MASKS = ("granite_docling",)
# Vision towers of video models that take every clip's frames flattened into the batch: (clips x frames, C, H, W).
FRAMES_IN_BATCH = ("xclip_vision_model",)
# Inputs that come with flattened patches (a model that patchifies images itself, RADIO, has none of them).
FLAT_PATCH_INPUTS = {"spatial_shapes", "image_patches", "pixel_position_ids"}
# Towers that take flattened patches without such an input (they are square grids).
FLAT_PATCH_TOWERS = ("molmo2_vision", "molmo2", "neomme")
# ... of which these take all images' patches packed, (patches, channels x patch x patch).
PACKED_FLAT_PATCHES = ("neomme",)


def embeds_flat_patches(model: torch.nn.Module, patch_features: int) -> bool:
    """Whether images are embedded from flattened patches (a Linear over channels x patch x patch, no convolution
    over the image channels): NaFlex-style towers (SigLIP 2, Fuyu) take (batch, patches, channels x patch x patch)."""
    modules = list(model.modules())
    linear = any(isinstance(module, torch.nn.Linear) and module.in_features == patch_features for module in modules)
    convolves = any(isinstance(module, torch.nn.Conv2d) for module in modules)
    return linear and not convolves


def flat_patch_inputs(parameters, batch, channels, patch, rows, columns, generator) -> dict:
    """Every image as its rows x columns patches, each flattened, with the grid and patch mask that say so."""
    inputs = {"pixel_values": torch.randn((batch, rows * columns, channels * patch * patch), generator=generator)}
    if "spatial_shapes" in parameters:
        inputs["spatial_shapes"] = torch.tensor([[rows, columns]] * batch)
    if "pixel_attention_mask" in parameters:
        inputs["pixel_attention_mask"] = torch.ones((batch, rows * columns), dtype=torch.long)
    if "pixel_position_ids" in parameters:  # each patch's (x, y) on the grid, row by row
        y, x = torch.meshgrid(torch.arange(rows), torch.arange(columns), indexing="ij")
        inputs["pixel_position_ids"] = torch.stack([x.flatten(), y.flatten()], -1).expand(batch, -1, -1)
    return inputs


def requires_image_sizes(model: torch.nn.Module) -> bool:
    """Whether the model's image features need each image's size (LLaVA-NeXT tiles, Pixtral's variable sizes)."""
    owner = feature_owner(model, "get_image_features")
    if owner is None:
        return False
    parameter = inspect.signature(owner.get_image_features).parameters.get("image_sizes")
    return parameter is not None and parameter.default is inspect.Parameter.empty


# Towers that take Qwen-style patches as (patches, channels, patch, patch) images, which they convolve without a
# reshape (others that convolve patches, HunYuan-VL's, reshape flat ones themselves: the modules do not tell).
UNFLATTENED_PATCHES = ("kimi_k25", "kimi_k25_vision", "paddleocr_vl")
# Towers that take one square of merged patches per language-model token (Inkling 2), by vision config type.
MERGED_PATCH_TOKENS = ("inkling2_vision",)
# ... and towers that take them as one sequence of such images: (1, patches, channels, patch, patch).
PATCH_SEQUENCES = ("paddleocr_vl_vision",)


def patch_inputs(
    model, config, pixel_name: str, grid_name: str, shape: InputShape, generator: torch.Generator, varied: bool = False
) -> dict:
    """Qwen-style flattened patches: (images x t x h x w, channels x temporal x patch x patch) and their grid; the
    towers of UNFLATTENED_PATCHES take each patch as an image. `varied`: images of different sizes (IMAGE_GRIDS), as
    a tower on its own must take any number of images of any sizes; else every image has the config's size."""
    vision = vision_config(config)
    channels, height, width = image_size(vision)
    patch = first_int(vision, ("patch_size",), 14)
    temporal = first_int(vision, ("temporal_patch_size", "patch_temporal"), 1)
    merge = first_int(vision, ("spatial_merge_size",), 1)
    grid_h, grid_w = height // patch, width // patch
    sizes = [(grid_h, grid_w)] * shape.batch
    if varied:
        sizes = [image_grid(grid_h, grid_w, merge, image + shape.seed) for image in range(shape.batch)]
    grid = torch.tensor([[1, h, w] for h, w in sizes])
    if grid_name.endswith("_hw"):  # a grid of images only: (height, width)
        grid = grid[:, 1:]
    count = sum(h * w for h, w in sizes)
    pixels = torch.randn((count, channels * temporal * patch * patch), generator=generator)
    if getattr(vision, "model_type", None) in MERGED_PATCH_TOKENS:
        # one entry per language-model token: merge x merge patches as one image square, channels last, and the
        # grid counted in those tokens
        merge = first_int(vision, ("spatial_merge_size",), 2)
        grid[:, -2:] //= merge
        pixels = pixels.view(-1, patch * merge, patch * merge, channels)
    elif config.model_type in UNFLATTENED_PATCHES:
        pixels = pixels.view(-1, channels, patch, patch)
    elif config.model_type in PATCH_SEQUENCES:
        pixels = pixels.view(1, -1, channels, patch, patch)
    return {pixel_name: pixels, grid_name: grid}


def image_grid(grid_h: int, grid_w: int, merge: int, index: int) -> tuple[int, int]:
    """The patch grid of the `index`-th image of IMAGE_GRIDS' cycle around the config's (grid_h, grid_w): the same,
    one merge block taller and narrower, one shorter and wider (sizes stay multiples of the merge size, >= one
    block)."""
    dh, dw = IMAGE_GRIDS[index % len(IMAGE_GRIDS)]
    h, w = grid_h + dh * merge, grid_w + dw * merge
    return (h, w) if h >= merge and w >= merge else (grid_h, grid_w)


# Changes of a varied image's grid, in merge blocks (patch_inputs): the batch-1 case gets the second size, the
# batch-3 case all three
IMAGE_GRIDS = ((0, 0), (1, -1), (-1, 1))


# Masks over audio frames that audio LMs need to count their features (`padding_mask`s are left out: codecs take
# them per sample, others per downsampled frame).
AUDIO_MASKS = ("input_features_mask", "feature_attention_mask", "audio_attention_mask")
# Audio tensors come in two layouts that neither the config nor the signature tells apart: raw audio as (batch,
# samples) or (batch, channels=1, samples), features as (batch, frames, bins) or (batch, bins, frames).
# `audio_layout` 0 is the likelier one for the config, 1 the other; the eager check tries both.
AUDIO_LAYOUTS = 2
# Feature extractors that give more than one feature per mel bin and frame, which the config does not say: Granite
# Speech 5's adds deltas (x2) and stacks frame pairs (x2).
FEATURES_PER_BIN = {"granite_speech5_encoder": 4}
FEATURE_BINS = (
    "feature_projection_input_dim",
    "num_mel_bins",
    "feature_size",
    "input_feat_size",
    "input_feat_per_channel",
    "input_dim",
    "n_mels",
)


def audio_inputs(
    config, parameters: set[str], main: str, layout: int, shape: InputShape, generator: torch.Generator
) -> dict:
    batch = shape.batch
    audio = sub_config(
        sub_config(config, "thinker_config"), "audio_config", "encoder_config", "encoder", "decoder_config"
    )
    audio = sub_config(audio, "asr_config")  # a speech-recognition tower beside others (diarization) in one config
    name = (
        main
        if main in ("input_features", "input_values")
        else next(name for name in ("input_features", "input_values") if name in parameters)
    )
    # the model's own audio varies with the case (`audio_samples`); an LM's audio beside its text, whose placeholder
    # tokens count its frames, stays at the example's length
    own = main in ("input_features", "input_values")
    samples, feature_frames = (audio_samples(shape), audio_frames(shape)) if own else (AUDIO_SAMPLES, AUDIO_FRAMES)
    spectrogram_frames = first_int(audio, ("max_length",), None) if hasattr(audio, "num_mel_bins") else None
    if name == "input_values" and spectrogram_frames:  # a spectrogram classifier (AST): (batch, frames, mel bins)
        frames = spectrogram_frames
        size = (batch, frames, audio.num_mel_bins)
    elif name == "input_values":
        # an encoder that cuts raw audio into tokens of a fixed number of samples takes whole tokens
        per_token = first_int(audio, ("samples_per_token",), 1)
        frames = -(-samples // per_token) * per_token
        size = (batch, frames) if layout == 0 else (batch, 1, frames)
    else:
        # features per frame: the bins, times the channels or the frames stacked into one (low frame rate encoders)
        # Gemma 4's audio tower names no bins: its first conv's channels are their count (it projects channels/4 x
        # the second's); with as many frames as bins (64 and 64) the harness once fed it either way round
        conv_channels = getattr(audio, "subsampling_conv_channels", None) or (80,)
        bins = first_int(audio, FEATURE_BINS, None) or conv_channels[0]
        bins *= first_int(audio, ("input_channels", "num_stacked_frames"), 1)
        bins *= FEATURES_PER_BIN.get(audio.model_type, 1)
        positions = first_int(audio, ("max_source_positions",), None)
        # whisper-like encoders take (batch, bins, frames), frames fixed at twice their positions
        channels_first = positions is not None and hasattr(audio, "num_mel_bins")
        window = 2 * first_int(audio, ("n_window",), 0) or 1  # chunked encoders take whole chunks
        frames = 2 * positions if channels_first else max(window, feature_frames // window * window)
        size = (batch, bins, frames) if channels_first == (layout == 0) else (batch, frames, bins)
        if "feature_lens" in parameters:  # Qwen-Omni's audio tower: every sample's frames packed, and their counts
            size = (bins, batch * frames)
        image_channels = first_int(audio, ("patch_embed_input_channels",), None)
        if image_channels:  # a spectrogram seen as an image (CLAP's audio Swin): (batch, channels, frames, bins)
            size = (batch, image_channels, frames, bins)
    inputs = {name: torch.randn(size, generator=generator)}
    if "feature_lens" in parameters and name == "input_features":
        inputs["feature_lens"] = torch.full((batch,), frames, dtype=torch.long)
    for mask in AUDIO_MASKS:
        if mask in parameters:
            inputs[mask] = torch.ones((batch, frames), dtype=torch.long)
    return inputs


@dataclass(frozen=True)
class Modality:
    """How a multimodal model marks one modality in `input_ids`: placeholder token names, framing tokens, and the
    method that returns the features the placeholders stand for."""

    placeholder: tuple[str, ...]
    start: tuple[str, ...]
    end: tuple[str, ...]
    features: str
    media: tuple[str, ...]  # the inputs that may carry it


MODALITIES = (
    Modality(
        ("image_token_id", "image_token_index"),
        ("vision_start_token_id", "image_start_token_id", "boi_token_id", "boi_token_index"),
        ("vision_end_token_id", "image_end_token_id", "eoi_token_id", "eoi_token_index"),
        "get_image_features",
        ("pixel_values",),
    ),
    Modality(
        ("audio_token_id", "audio_token_index"),
        ("audio_start_token_id", "audio_bos_token_id", "boa_token_id"),
        ("audio_end_token_id", "audio_eos_token_id", "eoa_token_id"),
        "get_audio_features",
        ("input_features", "input_values"),
    ),
)


VIDEO_MODALITY = Modality(("video_token_id", "video_token_index"), (), (), "get_video_features", ("pixel_values",))


# Layout models whose boxes are fractions of the page (UDOP scales them by its 2D position table), not 0..1000.
NORMALIZED_BOXES = ("udop",)


# Audio-code models that take one token per codebook channel on a trailing axis, (batch, length, channels): the
# config attribute that counts the channels, and how many more (Kyutai's text token beside its audio codes).
CODE_CHANNELS = {"dia_decoder": ("num_channels", 0), "kyutai_speech_to_text": ("num_codebooks", 1)}


def code_channels(config) -> tuple[int, ...]:
    if config.model_type not in CODE_CHANNELS:
        return ()
    name, extra = CODE_CHANNELS[config.model_type]
    return (getattr(config, name) + extra,)


def text_inputs(
    model, config, parameters: set[str], media: dict, shape: InputShape, generator: torch.Generator
) -> dict:
    rows = shape.batch
    if config.model_type.endswith("_decoder") and isinstance(getattr(config, "num_codebooks", None), int):
        rows *= config.num_codebooks  # an audio-code decoder (MusicGen) takes one row per sample and codebook
    input_ids = random_tokens(vocab(config), (rows, shape.text_length) + code_channels(config), generator)
    token_types = torch.zeros_like(input_ids)
    for kind, modality in enumerate(MODALITIES, start=1):
        if (
            modality is MODALITIES[0]
            and not hasattr(model, "get_image_features")
            and hasattr(model, "get_video_features")
        ):
            # a video-only model (InstructBLIP-Video): its clips in pixel_values stand for video placeholders
            modality = VIDEO_MODALITY
        placeholder = token_id(config, *modality.placeholder)
        owner = feature_owner(model, modality.features)
        if not set(modality.media) & set(media) or placeholder is None:
            continue
        if owner is not None:
            block = placeholder_block(owner, config, modality, placeholder, media, shape.batch)
        elif modality is MODALITIES[1]:
            # an audio LM without get_audio_features (Qwen2-Audio) expands one placeholder per sample itself
            block = torch.full((shape.batch, 1), placeholder, dtype=torch.long)
        else:
            continue
        input_ids = torch.cat([input_ids[:, :2], block, input_ids[:, 2:]], dim=1)
        token_types = torch.cat([token_types[:, :2], (block == placeholder).long() * kind, token_types[:, 2:]], 1)
    position_mask = None
    if "image_embeds_position_mask" in parameters and "pixel_values" in media:
        # Kosmos-2: the image's latent queries replace as many tokens, which a mask marks (after the first token)
        queries = first_int(config, ("latent_query_num",), 64)
        stand_ins = input_ids.new_full((rows, queries), SPECIAL_IDS)
        input_ids = torch.cat([input_ids[:, :1], stand_ins, input_ids[:, 1:]], 1)
        position_mask = torch.zeros_like(input_ids)
        position_mask[:, 1 : 1 + queries] = 1
    inputs = {"input_ids": input_ids}
    if position_mask is not None:
        inputs["image_embeds_position_mask"] = position_mask
    if "image_attention_mask" in parameters and "pixel_values" in media:  # every token sees every image
        inputs["image_attention_mask"] = torch.ones(
            (*input_ids.shape, media["pixel_values"].shape[1]), dtype=torch.long
        )
    if "bbox" in parameters:  # layout models: a box per token, (x0, y0, x1, y1) on the page (0..1000 at most)
        page = min(1001, first_int(sub_config(config, "text_config"), ("max_2d_position_embeddings",), 1001))
        corners = torch.randint(0, page, (*input_ids.shape, 2, 2), generator=generator).sort(dim=-2).values
        inputs["bbox"] = corners.flatten(-2)  # the smaller corner first
        if config.model_type in NORMALIZED_BOXES:
            inputs["bbox"] = inputs["bbox"] / 1000
    if "attention_mask" in parameters:
        inputs["attention_mask"] = torch.ones_like(input_ids)
    if "mm_token_type_ids" in parameters and media:
        inputs["mm_token_type_ids"] = token_types
    return inputs


def feature_owner(model: torch.nn.Module, method: str) -> torch.nn.Module | None:
    """The model, or its first submodule (a masked LM's inner model), that has `method` with named parameters (a
    wrapper's `(*args, **kwargs)` that forwards to its inner model does not say which inputs it takes)."""
    owners = [module for module in model.modules() if hasattr(module, method)]
    named = [module for module in owners if not only_variadic(getattr(module, method))]
    return (named or owners or [None])[0]


def feature_method_names(model: torch.nn.Module, name: str, method: str = "get_audio_features") -> bool:
    """Whether `method` of the model or of a submodule names the parameter `name`."""
    methods = (getattr(module, method) for module in model.modules() if hasattr(module, method))
    return any(name in inspect.signature(function).parameters for function in methods)


def feature_method_requires(model: torch.nn.Module, method: str, name: str) -> bool:
    """Whether `method` of the model or of a submodule (a wrapper passes **kwargs on to it) requires `name`."""
    for module in model.modules():
        if hasattr(module, method) and not only_variadic(getattr(module, method)):
            parameter = inspect.signature(getattr(module, method)).parameters.get(name)
            if parameter is not None and parameter.default is inspect.Parameter.empty:
                return True
    return False


def only_variadic(function) -> bool:
    parameters = inspect.signature(function).parameters.values()
    return all(parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD) for parameter in parameters)


def placeholder_block(model, config, modality: Modality, placeholder: int, media: dict, batch: int) -> torch.Tensor:
    """(batch, n) tokens: each sample's share of the features as placeholders, framed by the start/end tokens."""
    accepted = inspect.signature(getattr(model, modality.features)).parameters
    # a method that takes **kwargs passes them on (to the inner model's method): it gets every media input
    takes_all = any(parameter.kind is parameter.VAR_KEYWORD for parameter in accepted.values())
    tower = next((module.audio_tower for module in model.modules() if hasattr(module, "audio_tower")), None)
    if "input_ids" in accepted and modality is MODALITIES[1] and tower is not None:
        # features that read their placeholders' positions in the text (Music Flamingo's time embedding): as many
        # as the audio tower's own length formula gives for the unpadded frames
        frames = next(media[mask] for mask in AUDIO_MASKS if mask in media).sum(-1)
        lengths = tower._get_feat_extract_output_lengths(frames)
        count = int((lengths[-1] if isinstance(lengths, tuple) else lengths)[0])
    else:
        with torch.no_grad():
            passed = {k: v for k, v in media.items() if k in accepted or takes_all}
            count = feature_count(getattr(model, modality.features)(**passed)) // batch
    start, end = token_id(config, *modality.start), token_id(config, *modality.end)
    block = [start] * (start is not None) + [placeholder] * count + [end] * (end is not None)
    return torch.tensor(block, dtype=torch.long).expand(batch, -1)


def feature_count(features) -> int:
    """The number of feature vectors in a get_*_features result (a tensor, a list of them, or a ModelOutput)."""
    deepstack = getattr(features, "deepstack_features", None)
    if deepstack and isinstance(deepstack[0], tuple) and isinstance(deepstack[0][0], int):
        # Granite 4 Vision: (text layer, features) pairs, as many features each (Qwen3-VL's are plain tensors)
        return feature_count(deepstack[0][1])
    if isinstance(features, transformers.utils.ModelOutput):
        features = features.pooler_output if getattr(features, "pooler_output", None) is not None else features[0]
    if isinstance(features, torch.Tensor):
        return features.shape[:-1].numel()
    return sum(feature_count(item) for item in features)
