"""Tiny models for every model type: the tiny rule across modalities, the memory refusal, and the isolated sweep.

The model tests run in this process (seconds each); the isolation tests run scripted checks (crash, raise, hang,
allocate) in forkserver children, whose functions are pickled by reference to this module.
"""

import json
import os
import re
import time

import pytest
import torch
from transformers import PretrainedConfig, WhisperForConditionalGeneration
from transformers.models.auto.configuration_auto import CONFIG_MAPPING, CONFIG_MAPPING_NAMES
from transformers.utils.import_utils import is_natten_available, is_timm_available, requires_backends

from exportsmith.verify import isolate, tiny
from exportsmith.verify.isolate import check_eager, recorded, run_isolated, sweep
from exportsmith.verify.tasks import config_for, containing_model_type, dummy_inputs, model_class
from exportsmith.verify.tiny import NUM_LAYERS, TooLarge, build_tiny_model, tiny_config

# One or more per modality: decoder, encoder-decoder, encoder, vision, speech, raw audio, image-text, mixture of
# experts, multi-latent attention, per-layer `layer_types`, a hybrid state-space model.
REPRESENTATIVE = [
    "llama",
    "t5",
    "bert",
    "vit",
    "whisper",
    "wav2vec2",
    "llava",
    "qwen2_vl",
    "mixtral",
    "deepseek_v3",
    "gemma3",
    "bamba",
]


def token_ids(config) -> dict[str, int]:
    """Every special token id of a config and its sub-configs, by dotted name."""
    ids = {}
    for name, value in config.to_dict().items():
        if isinstance(value, int) and not isinstance(value, bool) and name.endswith(("token_id", "token_index")):
            ids[name] = value
    for name in getattr(config, "sub_configs", {}):
        sub = getattr(config, name, None)
        if sub is not None:
            ids.update({f"{name}.{key}": value for key, value in token_ids(sub).items()})
    return ids


@pytest.mark.parametrize("model_type", REPRESENTATIVE)
def test_tiny_model_builds_under_the_budget_and_runs_eager(model_type):
    record = check_eager(model_type)
    assert record["status"] == "ok", record["reason"]
    assert record["params"] < 2_000_000


@pytest.mark.parametrize("model_type", ["llava", "qwen2_vl", "whisper", "gemma3"])
def test_token_ids_are_inside_the_vocabulary(model_type):
    config = tiny_config(model_type)
    vocab_size = config.get_text_config().vocab_size
    ids = token_ids(config)
    assert ids, "no special token ids found"
    assert all(0 <= value < vocab_size for value in ids.values()), ids


@pytest.mark.parametrize("model_type", ["gemma3", "qwen3_next", "bamba"])
def test_per_layer_lists_follow_the_layer_count(model_type):
    config = tiny_config(model_type).get_text_config()
    assert config.num_hidden_layers == NUM_LAYERS
    assert len(config.layer_types) == NUM_LAYERS
    # the default mixes layer kinds: the tiny model keeps one of each that fits
    assert len(set(config.layer_types)) == 2


def test_sub_configs_shrink_by_the_same_rule():
    config = tiny_config("llava")
    text, vision = config.text_config, config.vision_config
    assert text.hidden_size == vision.hidden_size == tiny.HIDDEN_SIZE
    assert text.num_hidden_layers == vision.num_hidden_layers == NUM_LAYERS
    assert text.num_attention_heads * text.head_dim == text.hidden_size
    assert text.num_attention_heads % text.num_key_value_heads == 0
    assert vision.image_size % vision.patch_size == 0


def test_multimodal_inputs_hold_one_image_token_per_image_feature():
    _, cls = model_class("llava")
    model = build_tiny_model(cls, tiny_config("llava"))
    inputs = dummy_inputs(model)
    image_tokens = (inputs["input_ids"] == model.config.image_token_id).sum().item()
    with torch.no_grad():
        features = model.get_image_features(pixel_values=inputs["pixel_values"]).pooler_output  # one per image
    assert image_tokens == sum(image.shape[:-1].numel() for image in features) > 0


def test_speech_encoder_decoder_gets_features_of_the_configured_length():
    config = tiny_config("whisper")
    model = build_tiny_model(WhisperForConditionalGeneration, config)
    inputs = dummy_inputs(model)
    assert inputs["input_features"].shape[1:] == (config.num_mel_bins, 2 * config.max_source_positions)
    assert inputs["decoder_input_ids"].shape[0] == inputs["input_features"].shape[0]
    with torch.no_grad():
        model(**inputs)


def test_a_model_over_the_budget_is_refused_before_it_is_built(monkeypatch):
    _, cls = model_class("llama")
    config = config_for(cls, tiny_config("llama"))
    devices = []

    class Spy(cls):
        def __init__(self, config):
            devices.append(torch.get_default_device().type)
            super().__init__(config)

    monkeypatch.setattr(tiny, "MAX_PARAMS", 1_000)
    with pytest.raises(TooLarge, match="budget 1,000"):
        build_tiny_model(Spy, config)
    assert devices == ["meta"]


def test_the_eager_check_records_a_refusal(monkeypatch):
    monkeypatch.setattr(tiny, "MAX_PARAMS", 1_000)
    record = check_eager("llama")
    assert record["status"] == "refused" and "budget" in record["reason"]


# Scripted checks, run in children: what each does is in its model type's name.
def scripted_check(model_type: str) -> dict:
    if model_type == "exits":
        os._exit(3)
    if model_type == "raises":
        raise RuntimeError("boom")
    if model_type == "hangs":
        time.sleep(60)
    if model_type == "allocates":
        bytearray(8 * 2**30)
    return {"status": "ok", "reason": "", "params": 1}


def exiting_check(model_type: str) -> dict:
    os._exit(3)


def test_the_sweep_records_crashes_and_timeouts_and_goes_on(tmp_path, capsys):
    path = tmp_path / "records.jsonl"
    # A generous timeout: children start slowly on a loaded 2-core machine.
    records = sweep(["exits", "hangs", "raises", "fine"], path, check=scripted_check, timeout=10)
    assert {name: record["status"] for name, record in records.items()} == {
        "exits": "crash",
        "hangs": "timeout",
        "raises": "crash",
        "fine": "ok",
    }
    assert "exit" in records["exits"]["reason"] and "code 3" in records["exits"]["reason"]
    assert "RuntimeError: boom" in records["raises"]["reason"]
    assert len(path.read_text().splitlines()) == 4
    progress = capsys.readouterr().err
    assert "[4/4]" in progress and "hangs timeout" in progress


def test_the_sweep_resumes_and_skips_recorded_types(tmp_path):
    path = tmp_path / "records.jsonl"
    sweep(["fine", "also-fine"], path, check=scripted_check)
    # A check that would crash on every type: only the new type may run.
    records = sweep(["fine", "also-fine", "new"], path, check=exiting_check)
    assert records["fine"]["status"] == records["also-fine"]["status"] == "ok"
    assert records["new"]["status"] == "crash"
    recorded = [json.loads(line)["model_type"] for line in path.read_text().splitlines()]
    assert sorted(recorded[:2]) == ["also-fine", "fine"] and recorded[2:] == ["new"]  # two children ran at once


def test_a_torn_last_line_is_checked_again(tmp_path):
    path = tmp_path / "records.jsonl"
    path.write_text(json.dumps({"model_type": "fine", "status": "ok"}) + '\n{"model_type": "al')
    records = sweep(["fine", "also-fine"], path, check=scripted_check)
    assert records["also-fine"]["status"] == "ok"
    assert len(recorded(path)) == 2 and path.read_text().count("\n") == 3


def test_an_allocation_over_the_memory_cap_is_recorded_as_oom():
    record = run_isolated("allocates", check=scripted_check, memory_limit=6 * 2**30)
    assert record.status == "oom", record


def test_a_part_without_a_class_is_run_inside_its_container():
    assert containing_model_type("sam3_geometry_encoder") == "sam3"
    assert containing_model_type("llama") is None
    record = check_eager("sam3_geometry_encoder")
    assert record["status"] == "ok" and record["reason"] == "built as part of sam3", record
    assert record["model_class"] == "Sam3Model"


def test_a_missing_optional_package_is_a_refusal_with_its_name(monkeypatch):
    def needs_natten(model_class, config):
        requires_backends(model_class, ["natten"])

    if is_natten_available():
        pytest.skip("natten is installed")
    monkeypatch.setattr(isolate, "build_tiny_model", needs_natten)
    record = check_eager("llama")
    assert record["status"] == "refused" and record["reason"] == "needs the optional package natten", record


@pytest.mark.parametrize("model_type", ["depth_anything", "rt_detr"])
def test_a_backbone_returns_as_many_stages_as_before(model_type):
    default, config = CONFIG_MAPPING[model_type]().backbone_config, tiny_config(model_type).backbone_config
    assert len(config.out_indices) == len(set(config.out_indices)) == len(default.out_indices) > NUM_LAYERS - 1
    assert config.out_features == [config.stage_names[index] for index in config.out_indices]


def test_a_layer_stack_backbone_keeps_one_layer_per_returned_layer():
    config = tiny_config("depth_anything")
    assert config.backbone_config.num_hidden_layers == len(config.neck_hidden_sizes) == 4
    record = check_eager("depth_anything")
    assert record["status"] == "ok", record["reason"]


def test_detector_queries_fit_in_the_tiny_image_tokens():
    # a 32 x 32 image at strides 8, 16, 32 gives 16 + 4 + 1 tokens to pick the queries from by top-k
    assert tiny_config("rt_detr").num_queries <= 16
    record = check_eager("rt_detr")
    assert record["status"] == "ok", record["reason"]


@pytest.mark.parametrize(
    "model_type",
    [
        "t5gemma2_text",
        "dbrx",
        "esm",
        "step3p5",
        "paddleocr_vl_text",
        "instructblip",
        "vipllava",
        "hrm_text",
        "zamba",
        "cohere_compass_text",
        "lilt",
        "layoutlmv3",
        "qwen2_5_omni_thinker",
        "dots1",
        "lfm2_moe",
        "qwen4_exp_text",
        "reformer",
    ],
)
def test_overrides_supply_what_the_defaults_lack(model_type):
    # the default config of each does not build (an attribute its modeling code reads is missing)
    assert tiny.MODEL_OVERRIDES[model_type]
    record = check_eager(model_type)
    assert record["status"] == "ok", record["reason"]


def test_every_mixture_of_experts_has_several_experts():
    """The tiny sizes only shrink a default: hunyuan_v1_moe's default of one expert left a mixture of one (and
    transformers' experts then counted tokens with `histc(min=0, max=0)`, the data's range). vitpose's
    `num_experts` counts its datasets' heads, one by default as in its checkpoints."""
    pattern = re.compile(r"num_local_experts|num_experts|n_routed_experts|moe_num_experts|num_routed_experts")

    def single(config, prefix=""):
        for name, value in vars(config).items():
            if isinstance(value, PretrainedConfig):
                yield from single(value, f"{prefix}{name}.")
            elif pattern.fullmatch(name) and value == 1:
                yield prefix + name

    found = {}
    for model_type in sorted(CONFIG_MAPPING_NAMES):
        try:
            config = tiny_config(model_type)
        except Exception:  # counted by the sweep's build column
            continue
        if fields := list(single(config)):
            found[model_type] = fields
    assert found == {"vitpose": ["backbone_config.num_experts"], "vitpose_backbone": ["num_experts"]}


def test_a_codec_keeps_its_upsampling_groups_and_quantizer_widths_consistent():
    config = tiny_config("mimi")
    assert config.upsample_groups == config.hidden_size == tiny.HIDDEN_SIZE
    assert config.vector_quantization_hidden_dimension == config.codebook_dim
    record = check_eager("mimi")
    assert record["status"] == "ok", record["reason"]


def test_an_encoder_of_stacked_audio_features_gets_its_input_width():
    _, cls = model_class("granite_speech_encoder")
    model = build_tiny_model(cls, config_for(cls, tiny_config("granite_speech_encoder")))
    assert dummy_inputs(model)["hidden_states"].shape[-1] == model.config.input_dim != tiny.HIDDEN_SIZE
    assert check_eager("granite_speech_encoder")["status"] == "ok"


def test_a_tower_embedding_flat_patches_gets_them_with_their_grid():
    _, cls = model_class("siglip2_vision_model")
    model = build_tiny_model(cls, config_for(cls, tiny_config("siglip2_vision_model")))
    inputs = dummy_inputs(model)
    patch, channels = model.config.patch_size, model.config.num_channels
    rows = model.config.image_size // patch if hasattr(model.config, "image_size") else None
    assert inputs["pixel_values"].shape[-1] == channels * patch * patch
    assert inputs["spatial_shapes"].prod(-1).tolist() == [inputs["pixel_values"].shape[1]] * 2
    assert rows is None or inputs["spatial_shapes"][0].tolist() == [rows, rows]
    assert check_eager("siglip2_vision_model")["status"] == "ok"


@pytest.mark.parametrize("model_type", ["sam", "sam_hq_mask_decoder"])
def test_segment_anything_widths_follow_the_tiny_width(model_type):
    config = tiny_config("sam_hq")
    assert 2 * config.vision_config.num_pos_feats == config.mask_decoder_config.hidden_size
    assert config.mask_decoder_config.vit_dim == config.vision_config.hidden_size
    assert check_eager(model_type)["status"] == "ok"


@pytest.mark.parametrize("model_type", ["sam2", "sam2_prompt_encoder", "sam3_tracker"])
def test_segment_anything_2_and_3_trackers_run_with_their_table_entries(model_type):
    record = check_eager(model_type)
    assert record["status"] == "ok", record["reason"]
    assert record["params"] < 2_000_000


@pytest.mark.parametrize("model_type", ["time_series_transformer", "patchtst"])
def test_a_forecaster_gets_a_history_of_its_context_and_lags(model_type):
    _, cls = model_class(model_type)
    model = build_tiny_model(cls, config_for(cls, tiny_config(model_type)))
    inputs = dummy_inputs(model)
    lags = getattr(model.config, "lags_sequence", None) or [0]
    assert inputs["past_values"].shape[1] == model.config.context_length + max(lags)
    assert check_eager(model_type)["status"] == "ok"


def test_widths_listed_per_block_keep_the_stem_that_feeds_them():
    default, config = CONFIG_MAPPING["pp_lcnet_v4"](), tiny_config("pp_lcnet_v4")
    assert list(config.stem_channels) == list(default.stem_channels)
    assert config.stem_channels[-1] == config.block_configs[0][0][1]  # the stem's output is the first block's input
    assert check_eager("pp_lcnet_v4")["status"] == "ok"


def test_an_audio_code_decoder_gets_one_row_per_sample_and_codebook():
    _, cls = model_class("musicgen_decoder")
    model = build_tiny_model(cls, config_for(cls, tiny_config("musicgen_decoder")))
    assert dummy_inputs(model)["input_ids"].shape[0] == 2 * model.config.num_codebooks
    assert check_eager("musicgen_decoder")["status"] == "ok"


def test_a_sub_config_s_derived_width_shrinks_with_it():
    # ViT's pooler width is derived from its width once set: a dual encoder's default sets it explicitly
    config = tiny_config("vision-text-dual-encoder")
    assert config.vision_config.pooler_output_size == config.vision_config.hidden_size == tiny.HIDDEN_SIZE
    assert check_eager("vision-text-dual-encoder")["status"] == "ok"


@pytest.mark.parametrize("model_type", ["bros", "layoutlm"])
def test_a_layout_model_gets_one_ordered_box_per_token(model_type):
    _, cls = model_class(model_type)
    model = build_tiny_model(cls, config_for(cls, tiny_config(model_type)))
    inputs = dummy_inputs(model)
    bbox = inputs["bbox"]
    assert bbox.shape == (*inputs["input_ids"].shape, 4)
    assert (bbox[..., 0] <= bbox[..., 2]).all() and (bbox[..., 1] <= bbox[..., 3]).all()
    assert check_eager(model_type)["status"] == "ok"


def test_a_tower_that_patchifies_images_itself_gets_images():
    # RADIO's patch embedding is a Linear over flattened patches too, but it cuts the patches itself
    _, cls = model_class("radio")
    model = build_tiny_model(cls, config_for(cls, tiny_config("radio")))
    assert dummy_inputs(model)["pixel_values"].dim() == 4
    assert check_eager("radio")["status"] == "ok"


def test_widths_named_otherwise_shrink_too():
    # a vocoder's first upsampling width, byte-group hash vocabularies and a global width named with a suffix
    assert tiny_config("qwen2_5_omni_bigvgan").upsample_initial_channel == tiny.HIDDEN_SIZE
    blt = tiny_config("blt")
    assert blt.encoder_hash_byte_group_vocab == tiny.VOCAB_SIZE
    assert blt.encoder_config.hidden_size_global == blt.global_config.hidden_size == tiny.HIDDEN_SIZE
    record = check_eager("qwen2_5_omni_bigvgan")  # a mel spectrogram in, over the bins
    assert record["status"] == "ok" and record["params"] < 2_000_000, record


@pytest.mark.parametrize(
    ("model_type", "path"),
    [
        ("qwen3_moe", "num_local_experts"),  # stored as `num_experts`
        ("qwen3_vl_moe", "text_config.num_local_experts"),
        ("omdet-turbo", "d_model"),  # stored as `hidden_size`
        ("inkling_vision", "num_hidden_layers"),  # stored as `n_layers`
    ],
)
def test_a_field_stored_under_an_attribute_map_name_is_shrunk(model_type, path):
    config = tiny_config(model_type)
    for name in path.split("."):
        config = getattr(config, name)
    default = CONFIG_MAPPING[model_type]()
    for name in path.split("."):
        default = getattr(default, name)
    assert config < default and config == tiny.size_rule(path.split(".")[-1]), (config, default)


def test_a_spectrogram_classifier_gets_frames_by_mel_bins():
    _, cls = model_class("audio-spectrogram-transformer")
    model = build_tiny_model(cls, config_for(cls, tiny_config("audio-spectrogram-transformer")))
    values = dummy_inputs(model)["input_values"]
    assert values.shape == (2, model.config.max_length, model.config.num_mel_bins)
    assert check_eager("audio-spectrogram-transformer")["status"] == "ok"


def test_a_multimodal_model_without_its_towers_gets_text_only():
    _, cls = model_class("gemma4")
    model = build_tiny_model(cls, config_for(cls, tiny_config("gemma4")))
    assert model.config.vision_config is None
    assert "pixel_values" not in dummy_inputs(model)
    assert check_eager("gemma4")["status"] == "ok"


def test_a_part_its_container_leaves_out_is_not_counted():
    record = check_eager("gemma4_unified_vision")
    assert record["status"] == "build-error" and "leaves it out" in record["reason"], record


def test_a_decoder_built_on_its_own_gets_encoder_states_to_attend_to():
    _, cls = model_class("t5gemma2_decoder")
    model = build_tiny_model(cls, config_for(cls, tiny_config("t5gemma2_decoder")))
    states = dummy_inputs(model)["encoder_hidden_states"]
    assert states.shape == (2, 8, model.config.hidden_size)
    assert check_eager("t5gemma2_decoder")["status"] == "ok"


def test_per_layer_kv_head_counts_shrink_like_the_kv_head_count():
    config = tiny_config("sapiens2")
    assert config.num_key_value_heads_per_layer == [tiny.NUM_KV_HEADS] * NUM_LAYERS
    assert config.num_attention_heads % tiny.NUM_KV_HEADS == 0
    assert check_eager("sapiens2")["status"] == "ok"


@pytest.mark.parametrize(
    "model_type", ["levit", "vitmatte", "textnet", "zoedepth", "depth_pro", "mobilevitv2", "xmod", "dory"]
)
def test_vision_overrides_match_the_real_stride_and_widths(model_type):
    assert tiny.MODEL_OVERRIDES[model_type]
    record = check_eager(model_type)
    assert record["status"] == "ok", record["reason"]


def test_a_generic_inputs_parameter_is_given_under_its_specific_name():
    # Perceiver's masked LM takes token ids as `inputs` or `input_ids`; a speech encoder-decoder its encoder's input
    for model_type, expected in (("perceiver", "input_ids"), ("speech-encoder-decoder", "input_values")):
        _, cls = model_class(model_type)
        model = build_tiny_model(cls, config_for(cls, tiny_config(model_type)))
        inputs = dummy_inputs(model)
        assert expected in inputs and "inputs" not in inputs, model_type
        assert check_eager(model_type)["status"] == "ok"


def test_flattened_patches_carry_the_temporal_patch_under_its_other_name():
    _, cls = model_class("muse_glimmer_vision")
    model = build_tiny_model(cls, config_for(cls, tiny_config("muse_glimmer_vision")))
    config = model.config
    assert dummy_inputs(model)["pixel_values"].shape[-1] == 3 * config.patch_temporal * config.patch_size**2
    assert check_eager("muse_glimmer_vision")["status"] == "ok"


def test_a_keypoint_matcher_s_base_model_gets_image_pairs():
    _, cls = model_class("efficientloftr")
    model = build_tiny_model(cls, config_for(cls, tiny_config("efficientloftr")))
    assert dummy_inputs(model)["pixel_values"].shape[1] == 2


def test_raw_audio_cut_into_tokens_is_whole_tokens_and_gets_its_placeholders():
    _, cls = model_class("muse_spark")
    model = build_tiny_model(cls, config_for(cls, tiny_config("muse_spark")))
    inputs = dummy_inputs(model)
    per_token = model.config.audio_config.samples_per_token
    assert inputs["input_values"].shape[-1] % per_token == 0
    assert (inputs["input_ids"] == model.config.audio_token_id).any()
    assert check_eager("muse_spark")["status"] == "ok"


def test_a_model_without_a_forward_is_refused_with_the_reason():
    record = check_eager("chameleon_vqgan")
    assert record["status"] == "refused" and "defines no forward" in record["reason"], record


def test_multi_latent_query_heads_are_their_position_free_and_rotary_parts():
    config = tiny_config("longcat_flash")
    assert config.qk_head_dim == config.qk_nope_head_dim + config.qk_rope_head_dim
    assert check_eager("longcat_flash")["status"] == "ok"


def test_an_encoder_of_stacked_frames_gets_bins_times_frames_per_frame():
    _, cls = model_class("fun_asr_nano_encoder")
    model = build_tiny_model(cls, config_for(cls, tiny_config("fun_asr_nano_encoder")))
    features = dummy_inputs(model)["input_features"]
    assert model.config.num_mel_bins * model.config.num_stacked_frames in features.shape[1:]
    assert check_eager("fun_asr_nano_encoder")["status"] == "ok"


def test_patches_merged_per_image_come_with_their_grid_and_reach_a_wrapper_s_feature_method():
    # VideoLLaMA 3 takes the processor's merge size per image; its wrapper's get_image_features passes **kwargs on
    _, cls = model_class("video_llama_3")
    model = build_tiny_model(cls, config_for(cls, tiny_config("video_llama_3")))
    inputs = dummy_inputs(model)
    assert inputs["image_merge_sizes"].shape == (inputs["image_grid_thw"].shape[0],)
    assert (inputs["input_ids"] == model.config.image_token_id).any()
    assert check_eager("video_llama_3")["status"] == "ok"


def test_patches_a_tower_convolves_as_images_come_unflattened():
    _, cls = model_class("kimi_k25_vision")
    model = build_tiny_model(cls, config_for(cls, tiny_config("kimi_k25_vision")))
    patch = model.config.patch_size
    assert dummy_inputs(model)["pixel_values"].shape[1:] == (3, patch, patch)
    assert check_eager("kimi_k25_vision")["status"] == "ok"


def test_an_audio_tower_of_packed_frames_gets_them_with_their_counts():
    _, cls = model_class("qwen2_5_omni_audio_encoder")
    model = build_tiny_model(cls, config_for(cls, tiny_config("qwen2_5_omni_audio_encoder")))
    inputs = dummy_inputs(model)
    assert inputs["input_features"].shape == (model.config.num_mel_bins, int(inputs["feature_lens"].sum()))
    assert check_eager("qwen2_5_omni_audio_encoder")["status"] == "ok"


@pytest.mark.parametrize("model_type", ["ernie4_5_vl_moe_text", "qwen3_asr"])
def test_multimodal_overrides_match_the_modeling_code(model_type):
    assert tiny.MODEL_OVERRIDES[model_type]
    record = check_eager(model_type)
    assert record["status"] == "ok", record["reason"]


def test_audio_features_that_need_the_padding_mask_get_one_over_the_samples():
    _, cls = model_class("vibevoice")
    model = build_tiny_model(cls, config_for(cls, tiny_config("vibevoice")))
    inputs = dummy_inputs(model, audio_layout=1)  # (batch, 1, samples): the layout it runs at
    assert inputs["padding_mask"].shape == inputs["input_values"].shape[:1] + inputs["input_values"].shape[-1:]
    assert check_eager("vibevoice")["status"] == "ok"


def test_idefics_gets_a_list_of_one_image_per_sample_that_every_token_sees():
    _, cls = model_class("idefics")
    model = build_tiny_model(cls, config_for(cls, tiny_config("idefics")))
    inputs = dummy_inputs(model)
    assert inputs["pixel_values"].dim() == 5 and inputs["pixel_values"].shape[1] == 1
    assert inputs["image_attention_mask"].shape == (*inputs["input_ids"].shape, 1)
    assert check_eager("idefics")["status"] == "ok"


def test_a_spectrogram_seen_as_an_image_gets_a_channel_axis():
    _, cls = model_class("clap_audio_model")
    model = build_tiny_model(cls, config_for(cls, tiny_config("clap_audio_model")))
    features = dummy_inputs(model)["input_features"]
    assert features.shape[1] == model.config.patch_embed_input_channels and features.shape[-1] == 64
    assert check_eager("clap")["status"] == "ok"


def test_a_text_line_recognizer_gets_a_line_image_its_pooling_fits():
    _, cls = model_class("pp_ocrv5_mobile_rec")
    model = build_tiny_model(cls, config_for(cls, tiny_config("pp_ocrv5_mobile_rec")))
    assert dummy_inputs(model)["pixel_values"].shape[-2:] == (96, 64)
    assert check_eager("pp_ocrv5_mobile_rec")["status"] == "ok"


def test_an_audio_mask_the_features_do_not_count_with_is_left_out():
    # Granite Speech's input_features_mask selects projected audio tokens, not frames
    _, cls = model_class("granite_speech")
    model = build_tiny_model(cls, config_for(cls, tiny_config("granite_speech")))
    assert "input_features_mask" not in dummy_inputs(model)
    assert check_eager("granite_speech")["status"] == "ok"


def test_audio_feature_widths_come_from_the_asr_tower_and_the_feature_extractor():
    # Nemotron's transcriber keeps its mel bins in asr_config; Granite Speech 5 gets deltas of stacked frame pairs
    for model_type, per_bin in (("nemotron3_5_transcribe_audio", 1), ("granite_speech5_encoder", 4)):
        _, cls = model_class(model_type)
        model = build_tiny_model(cls, config_for(cls, tiny_config(model_type)))
        config = getattr(model.config, "asr_config", model.config)
        features = dummy_inputs(model)["input_features"]
        assert config.num_mel_bins * per_bin in features.shape[1:], model_type
        assert check_eager(model_type)["status"] == "ok"


def test_a_single_config_that_sizes_images_gets_them():
    _, cls = model_class("vilt")
    model = build_tiny_model(cls, config_for(cls, tiny_config("vilt")))
    assert dummy_inputs(model)["pixel_values"].shape[-1] == model.config.image_size
    assert check_eager("vilt")["status"] == "ok"


def test_kosmos_2_marks_where_the_image_queries_go():
    _, cls = model_class("kosmos-2")
    model = build_tiny_model(cls, config_for(cls, tiny_config("kosmos-2")))
    inputs = dummy_inputs(model)
    assert inputs["image_embeds_position_mask"].shape == inputs["input_ids"].shape
    assert inputs["image_embeds_position_mask"].sum(1).tolist() == [model.config.latent_query_num] * 2
    assert check_eager("kosmos-2")["status"] == "ok"


def test_udop_boxes_are_fractions_of_the_page():
    _, cls = model_class("udop")
    model = build_tiny_model(cls, config_for(cls, tiny_config("udop")))
    boxes = dummy_inputs(model)["bbox"]
    assert boxes.is_floating_point() and 0 <= boxes.min() and boxes.max() <= 1
    assert check_eager("udop")["status"] == "ok"


@pytest.mark.parametrize("model_type", ["xlstm", "granite_speech5_encoder"])
def test_overrides_for_modeling_code_that_ignores_a_size(model_type):
    assert tiny.MODEL_OVERRIDES[model_type]
    assert check_eager(model_type)["status"] == "ok"


def test_a_grid_of_images_only_has_height_and_width():
    _, cls = model_class("nemotron_h_omni")
    model = build_tiny_model(cls, config_for(cls, tiny_config("nemotron_h_omni")))
    inputs = dummy_inputs(model)
    assert inputs["image_grid_hw"].shape == (2, 2)
    assert inputs["pixel_values"].shape[0] == int(inputs["image_grid_hw"].prod(-1).sum())
    assert check_eager("nemotron_h_omni")["status"] == "ok"


@pytest.mark.parametrize(
    "model_type",
    ["llama4_vision_model", "aria", "molmo2_vision", "efficientloftr", "superglue", "janus_vqgan", "xcodec"],
)
def test_vision_towers_sized_for_the_tiny_patch_grid(model_type):
    assert tiny.MODEL_OVERRIDES[model_type]
    assert check_eager(model_type)["status"] == "ok"


def test_a_refusal_names_every_missing_optional_package(monkeypatch):
    def needs_natten_and_timm(model_class, config):
        requires_backends(model_class, ["natten", "timm"])

    if is_natten_available() or is_timm_available():
        pytest.skip("natten or timm is installed")
    monkeypatch.setattr(isolate, "build_tiny_model", needs_natten_and_timm)
    record = check_eager("llama")
    assert record["status"] == "refused" and record["reason"] == "needs the optional packages natten, timm", record


def test_an_audio_code_decoder_with_code_channels_gets_them_on_a_trailing_axis():
    _, cls = model_class("dia")
    model = build_tiny_model(cls, config_for(cls, tiny_config("dia")))
    decoder_ids = dummy_inputs(model)["decoder_input_ids"]
    assert decoder_ids.shape == (2, 4, model.config.decoder_config.num_channels)
    assert check_eager("dia")["status"] == "ok" and check_eager("dia_decoder")["status"] == "ok"


def test_a_video_tower_of_frames_in_the_batch_gets_whole_clips():
    _, cls = model_class("xclip_vision_model")
    model = build_tiny_model(cls, config_for(cls, tiny_config("xclip_vision_model")))
    assert dummy_inputs(model)["pixel_values"].shape[0] == 2 * model.config.num_frames
    assert check_eager("xclip_vision_model")["status"] == "ok"


def test_flat_patches_with_position_ids_get_each_patch_s_grid_position():
    _, cls = model_class("gemma4_vision")
    model = build_tiny_model(cls, config_for(cls, tiny_config("gemma4_vision")))
    inputs = dummy_inputs(model)
    patches = inputs["pixel_values"].shape[1]
    assert inputs["pixel_position_ids"].shape == (2, patches, 2)
    assert inputs["pixel_position_ids"][0, -1].tolist() == [7, 7]  # the last patch of the 8 x 8 grid
    assert check_eager("gemma4_vision")["status"] == "ok"


def test_minicpm_v_gets_every_image_s_patches_in_one_strip_with_their_grids():
    _, cls = model_class("minicpmv4_6_vision")
    model = build_tiny_model(cls, config_for(cls, tiny_config("minicpmv4_6_vision")))
    inputs = dummy_inputs(model)
    patch = model.config.patch_size
    assert inputs["pixel_values"].shape == (1, 3, patch, int(inputs["target_sizes"].prod(-1).sum()) * patch)
    assert check_eager("minicpmv4_6_vision")["status"] == "ok"


@pytest.mark.parametrize(
    "model_type, leading", [("paddleocr_vl", (128,)), ("paddleocr_vl_vision", (1, 128)), ("kimi_k25", (128,))]
)
def test_patches_as_images_come_in_the_tower_s_layout(model_type, leading):
    _, cls = model_class(model_type)
    model = build_tiny_model(cls, config_for(cls, tiny_config(model_type)))
    assert dummy_inputs(model)["pixel_values"].shape == (*leading, 3, 4, 4)
    assert check_eager(model_type)["status"] == "ok"


def test_mllama_s_tower_gets_an_image_padded_to_its_tiles():
    _, cls = model_class("mllama_vision_model")
    model = build_tiny_model(cls, config_for(cls, tiny_config("mllama_vision_model")))
    inputs = dummy_inputs(model)
    tiles = model.config.max_num_tiles
    assert inputs["pixel_values"].shape[:3] == (2, 1, tiles)
    assert inputs["aspect_ratio_mask"].sum().item() == 2  # one real tile per image
    assert check_eager("mllama_vision_model")["status"] == "ok"


def test_kyutai_gets_its_text_token_and_audio_codes_on_a_trailing_axis():
    _, cls = model_class("kyutai_speech_to_text")
    model = build_tiny_model(cls, config_for(cls, tiny_config("kyutai_speech_to_text")))
    assert dummy_inputs(model)["input_ids"].shape == (2, 8, model.config.num_codebooks + 1)
    assert check_eager("kyutai_speech_to_text")["status"] == "ok"


def test_clvp_gets_the_features_its_decoder_conditions_on():
    _, cls = model_class("clvp")
    model = build_tiny_model(cls, config_for(cls, tiny_config("clvp")))
    features = dummy_inputs(model, audio_layout=1)["input_features"]
    assert features.shape[1] == model.config.decoder_config.feature_size
    assert check_eager("clvp")["status"] == "ok" and check_eager("clvp_encoder")["status"] == "ok"


@pytest.mark.parametrize("model_type", ["blip_2_qformer", "idefics2_perceiver"])
def test_a_q_former_or_resampler_on_its_own_gets_vectors_to_attend_to(model_type):
    _, cls = model_class(model_type)
    model = build_tiny_model(cls, config_for(cls, tiny_config(model_type)))
    inputs = dummy_inputs(model)
    main = next(name for name in ("query_embeds", "context") if name in inputs)
    assert inputs[main].dim() == 3
    assert check_eager(model_type)["status"] == "ok"


@pytest.mark.parametrize(
    "model_type, channels_first",
    [
        ("mimi_decoder", True),
        ("vibevoice_acoustic_tokenizer_decoder", True),
        ("vibevoice_acoustic_tokenizer_encoder", False),
    ],
)
def test_codec_halves_get_latents_or_raw_audio(model_type, channels_first):
    _, cls = model_class(model_type)
    model = build_tiny_model(cls, config_for(cls, tiny_config(model_type)))
    tensor = next(iter(dummy_inputs(model).values()))
    assert tensor.shape[1] == (model.config.hidden_size if channels_first else 1)
    assert check_eager(model_type)["status"] == "ok"


def test_pix2struct_gets_numbered_flattened_patches():
    _, cls = model_class("pix2struct_vision_model")
    model = build_tiny_model(cls, config_for(cls, tiny_config("pix2struct_vision_model")))
    patches = dummy_inputs(model)["flattened_patches"]
    assert patches.shape[-1] == 2 + model.config.patch_embed_hidden_size
    assert patches[0, -1, :2].tolist() == [4.0, 4.0]  # the last patch: row 4, column 4
    assert check_eager("pix2struct")["status"] == "ok"


@pytest.mark.parametrize(
    "model_type, main",
    [
        ("bridgetower_vision_model", "image"),
        ("florence_vision", "hidden_states"),
        ("decision_transformer", "states"),
        ("gemma3n_audio", "audio_mel"),
        ("lxmert", "visual_feats"),
    ],
)
def test_inputs_named_otherwise_are_built(model_type, main):
    _, cls = model_class(model_type)
    model = build_tiny_model(cls, config_for(cls, tiny_config(model_type)))
    assert dummy_inputs(model)[main].is_floating_point()
    assert check_eager(model_type)["status"] == "ok"


@pytest.mark.parametrize("model_type, name", [("oneformer", "task_inputs"), ("deepseek_ocr2_encoder", "num_patches")])
def test_required_side_inputs_are_built(model_type, name):
    _, cls = model_class(model_type)
    model = build_tiny_model(cls, config_for(cls, tiny_config(model_type)))
    assert name in dummy_inputs(model)
    assert check_eager(model_type)["status"] == "ok"


def test_seggpt_gets_an_image_and_a_prompt_each_half_its_canvas():
    _, cls = model_class("seggpt")
    model = build_tiny_model(cls, config_for(cls, tiny_config("seggpt")))
    inputs = dummy_inputs(model)
    height, width = model.config.image_size
    assert inputs["prompt_masks"].shape[-2:] == inputs["pixel_values"].shape[-2:] == (height // 2, width)
    assert check_eager("seggpt")["status"] == "ok"


def test_token_ids_of_a_vocabulary_of_a_few_markers_stay_in_it():
    # PP-DocLayout V2's reading-order model has 4 tokens (start, pad, end, pred): remapped ids would leave it
    reading_order = tiny_config("pp_doclayout_v2").reading_order_config
    ids = [reading_order.start_token_id, reading_order.pad_token_id, reading_order.end_token_id]
    assert max(ids + [reading_order.pred_token_id]) < reading_order.vocab_size
    assert check_eager("pp_doclayout_v2")["status"] == "ok"


def test_text_tokens_come_from_a_wrapped_model_s_vocabulary():
    _, cls = model_class("fastspeech2_conformer_with_hifigan")
    model = build_tiny_model(cls, config_for(cls, tiny_config("fastspeech2_conformer_with_hifigan")))
    assert dummy_inputs(model)["input_ids"].max() < model.config.model_config.vocab_size
    assert check_eager("fastspeech2_conformer_with_hifigan")["status"] == "ok"


def test_an_audio_lm_that_expands_its_placeholder_gets_one_per_sample():
    _, cls = model_class("qwen2_audio")
    model = build_tiny_model(cls, config_for(cls, tiny_config("qwen2_audio")))
    input_ids = dummy_inputs(model)["input_ids"]
    assert (input_ids == model.config.audio_token_index).sum(1).tolist() == [1, 1]
    assert check_eager("qwen2_audio")["status"] == "ok"


def test_a_part_whose_input_is_another_part_s_output_is_run_inside_its_container():
    # Sam3DetrEncoder has a class but no auto mapping; it takes the vision tower's features
    record = check_eager("sam3_detr_encoder")
    assert record["status"] == "ok" and record["reason"] == "built as part of sam3", record
    assert record["model_class"] == "Sam3Model"


def test_granite_docling_s_mask_marks_real_tiles():
    _, cls = model_class("granite_docling")
    model = build_tiny_model(cls, config_for(cls, tiny_config("granite_docling")))
    assert dummy_inputs(model)["pixel_attention_mask"].shape == (2, 1)
    assert check_eager("granite_docling")["status"] == "ok"


@pytest.mark.parametrize("model_type", ["sam2_video", "sam3_video"])
def test_a_video_tracker_gets_a_session_over_a_clip_with_one_prompt(model_type):
    _, cls = model_class(model_type)
    model = build_tiny_model(cls, config_for(cls, tiny_config(model_type)))
    inputs = dummy_inputs(model)
    session = inputs["inference_session"]
    assert type(session).__name__.endswith("InferenceSession") and inputs["frame_idx"] == 0
    assert session.num_frames == 2
    # a tracker follows one clicked object; SAM 3's video model detects what one text prompt names
    assert session.get_obj_num() == 1 or len(session.prompts) == 1
    with torch.no_grad():
        model(**inputs)


def test_a_config_that_propagates_its_image_size_gets_the_tiny_one_everywhere():
    config = tiny_config("sam3_video")
    assert config.tracker_config.image_size == config.detector_config.image_size == tiny.IMAGE_SIZE
    assert config.tracker_config.memory_attention_rope_feat_sizes == [tiny.IMAGE_SIZE // 4] * 2


@pytest.mark.parametrize("model_type", ["gemma4_assistant", "gemma4_unified_assistant"])
def test_a_drafter_gets_a_drafting_step_on_its_target_s_states(model_type):
    _, cls = model_class(model_type)
    model = build_tiny_model(cls, config_for(cls, tiny_config(model_type)))
    inputs = dummy_inputs(model)
    assert inputs["inputs_embeds"].shape[1:] == (1, 2 * model.config.backbone_hidden_size)
    assert set(inputs["shared_kv_states"]) == set(model.config.get_text_config().layer_types)
    with torch.no_grad():
        model(**inputs)


def test_a_default_config_that_fails_its_validator_is_built_with_the_fields_it_needs():
    # Gemma 4's assistant: its default text config has per-layer inputs, which its validator refuses
    text = tiny_config("gemma4_assistant").text_config
    assert text.hidden_size_per_layer_input == 0 and text.num_kv_shared_layers == text.num_hidden_layers


@pytest.mark.parametrize("model_type", ["gemma3n_text", "granite4_vision"])
def test_overrides_for_layer_maps_the_defaults_leave_unset_or_inconsistent(model_type):
    assert check_eager(model_type)["status"] == "ok"


@pytest.mark.parametrize("model_type", ["neucodec", "xcodec2"])
def test_a_codec_with_a_semantic_encoder_gets_audio_and_its_features(model_type):
    _, cls = model_class(model_type)
    model = build_tiny_model(cls, config_for(cls, tiny_config(model_type)))
    inputs = dummy_inputs(model)
    assert inputs["input_values"].shape[1] == 1  # (batch, 1, samples)
    bins = model.config.semantic_model_config.feature_projection_input_dim
    assert inputs["input_features"].shape[-1] == bins
    with torch.no_grad():
        model(**inputs)


def test_a_required_parameter_typed_optional_is_given_none():
    _, cls = model_class("phi4_multimodal_audio")
    model = build_tiny_model(cls, config_for(cls, tiny_config("phi4_multimodal_audio")))
    inputs = dummy_inputs(model)
    assert "mask" in inputs and inputs["mask"] is None
    assert inputs["hidden_states"].shape[-1] == model.config.input_size  # mel bins, not the width


def test_audio_cut_into_chunks_gets_each_chunk_s_sample_count():
    record = check_eager("dots3_note_audio_encoder")
    assert record["status"] == "ok", record["reason"]


def test_a_part_its_container_embeds_tokens_for_gets_embeddings():
    _, cls = model_class("qwen3_omni_moe_talker_code_predictor")
    model = build_tiny_model(cls, config_for(cls, tiny_config("qwen3_omni_moe_talker_code_predictor")))
    inputs = dummy_inputs(model)
    assert "input_ids" not in inputs and inputs["inputs_embeds"].shape[-1] == model.config.hidden_size
    with torch.no_grad():
        model(**inputs)


@pytest.mark.parametrize(
    "model_type, pixels",
    [("inkling2_vision", (32, 8, 8, 3)), ("inkling_vision", (128, 2, 4, 4, 3))],
)
def test_inkling_towers_get_patches_in_their_layout(model_type, pixels):
    # Inkling 2: one 2 x 2 square of patches per text token, channels last; Inkling: one cube of frames per patch
    _, cls = model_class(model_type)
    model = build_tiny_model(cls, config_for(cls, tiny_config(model_type)))
    inputs = dummy_inputs(model)
    assert tuple(inputs["pixel_values"].shape) == pixels
    with torch.no_grad():
        model(**inputs)


def test_quantized_mel_frames_get_one_level_per_bin():
    _, cls = model_class("inkling_audio")
    model = build_tiny_model(cls, config_for(cls, tiny_config("inkling_audio")))
    ids = dummy_inputs(model)["audio_input_ids"]
    assert ids.shape[-1] == model.config.n_mel_bins and int(ids.max()) < model.config.mel_vocab_size


def test_a_robot_policy_gets_its_state_a_denoising_step_and_a_camera_prompt():
    _, cls = model_class("pi0")
    model = build_tiny_model(cls, config_for(cls, tiny_config("pi0")))
    inputs = dummy_inputs(model)
    config = model.config
    assert inputs["state"].shape == (2, config.max_state_dim)
    assert inputs["noise"].shape == (2, config.chunk_size, config.max_action_dim)
    image_tokens = (inputs["input_ids"] == config.vlm_config.image_token_id).sum(-1)
    assert image_tokens.tolist() == [(32 // config.vlm_config.vision_config.patch_size) ** 2] * 2
    with torch.no_grad():
        model(**inputs)


def test_a_decision_head_gets_one_prompt_with_marked_questions():
    _, cls = model_class("jev")
    model = build_tiny_model(cls, config_for(cls, tiny_config("jev")))
    inputs = dummy_inputs(model)
    assert inputs["input_ids"].shape[0] == 1 and int(inputs["marks"].max()) <= inputs["input_ids"].shape[1]
    with torch.no_grad():
        model(**inputs)


def test_apertus_1_5_vocabulary_holds_both_codebooks_after_the_text():
    config = tiny_config("apertus1p5")
    assert config.image_token_offset + config.vision_config.codebook_size == config.audio_token_offset
    assert config.audio_token_offset + config.audio_config.codebook_size <= config.text_config.vocab_size


def test_a_block_diffusion_drafter_gets_a_block_and_its_target_s_tapped_states():
    _, cls = model_class("muse_glimmer_assistant")
    model = build_tiny_model(cls, config_for(cls, tiny_config("muse_glimmer_assistant")))
    inputs = dummy_inputs(model)
    config = model.config
    assert inputs["noise_embeds"].shape[1] == config.block_size
    assert inputs["context_hidden_states"].shape[-1] == config.hidden_size * len(config.target_layer_ids)
    with torch.no_grad():
        model(**inputs)


def test_a_code_to_mel_diffusion_step_gets_codes_repeated_into_its_mel_frames():
    _, cls = model_class("qwen2_5_omni_dit")
    model = build_tiny_model(cls, config_for(cls, tiny_config("qwen2_5_omni_dit")))
    inputs = dummy_inputs(model)
    frames = inputs["quantized_code"].shape[1] * model.config.repeats
    assert inputs["hidden_states"].shape[1] == inputs["speaker_embedding"].shape[1] == frames
    with torch.no_grad():
        model(**inputs)


def test_audio_features_that_read_their_placeholders_are_counted_by_the_tower_s_lengths():
    # Music Flamingo's audio features need the text with their placeholders: counted without calling them
    record = check_eager("musicflamingo")
    assert record["status"] == "ok", record["reason"]


def test_a_hybrid_vision_model_gets_the_images_for_its_high_resolution_tower_too():
    _, cls = model_class("deepseek_vl_hybrid")
    model = build_tiny_model(cls, config_for(cls, tiny_config("deepseek_vl_hybrid")))
    inputs = dummy_inputs(model)
    assert inputs["high_res_pixel_values"].shape[-1] == model.config.high_res_vision_config.image_size


def test_csm_audio_ends_after_the_codec_frame_its_placeholder_stands_for():
    _, cls = model_class("csm")
    model = build_tiny_model(cls, config_for(cls, tiny_config("csm")))
    inputs = dummy_inputs(model, audio_layout=1)
    codec = model.config.codec_config
    assert inputs["input_values_cutoffs"].tolist() == [[int(codec.sampling_rate / codec.frame_rate)]] * 2
    with torch.no_grad():
        model(**inputs)


def test_a_video_only_model_gets_clips_and_one_video_placeholder_per_feature():
    _, cls = model_class("instructblipvideo")
    model = build_tiny_model(cls, config_for(cls, tiny_config("instructblipvideo")))
    inputs = dummy_inputs(model)
    frames = inputs["pixel_values"].shape[1]
    placeholders = (inputs["input_ids"] == model.config.video_token_id).sum(-1)
    assert placeholders.tolist() == [frames * model.config.num_query_tokens] * 2
    with torch.no_grad():
        model(**inputs)


def test_packed_flat_patches_have_no_batch_axis():
    _, cls = model_class("neomme")
    model = build_tiny_model(cls, config_for(cls, tiny_config("neomme")))
    inputs = dummy_inputs(model)
    assert inputs["pixel_values"].shape == (2 * (32 // 4) ** 2, 3 * 4 * 4)
    with torch.no_grad():
        model(**inputs)


def test_molmo_2_gets_each_image_s_patches_pooled_into_its_tokens():
    _, cls = model_class("molmo2")
    model = build_tiny_model(cls, config_for(cls, tiny_config("molmo2")))
    inputs = dummy_inputs(model)
    pooling, grids = inputs["image_token_pooling"], inputs["image_grids"]
    # every patch of every crop pooled once, by one of the 4 x 4 tokens of its image
    assert sorted(pooling.flatten().tolist()) == list(range(inputs["pixel_values"].shape[:2].numel()))
    assert grids.tolist() == [[4, 4, 0, 0]] * 2
    with torch.no_grad():
        model(**inputs)


@pytest.mark.parametrize("model_type", ["rag", "moshi_depth", "voxtral_realtime_text", "qwen3_omni_moe_thinker"])
def test_inputs_a_container_or_a_retriever_would_give(model_type):
    assert check_eager(model_type)["status"] == "ok"


def test_uvdoc_s_backbone_returns_every_bridge_stage_its_connector_concatenates():
    config = tiny_config("uvdoc")
    assert config.backbone_config.out_indices == [1, 2, 3, 4, 5, 6]
    assert check_eager("uvdoc")["status"] == "ok"


def test_pp_doclayout_v3_s_mask_head_reads_the_tiny_backbone_s_first_stage():
    config = tiny_config("pp_doclayout_v3")
    assert config.x4_feat_dim == config.backbone_config.hidden_sizes[0]


@pytest.mark.parametrize(
    ("model_type", "paths"),
    [
        ("nemotron3_5_transcribe_audio", ("asr_config", "diarization_config.audio_config")),
        ("nemotron3_5_transcribe_asr_audio", ("",)),
        ("nemotron3_5_transcribe_word_timestamp", ("",)),
        ("nemotron3_diarization", ("audio_config",)),
        ("nemotron3_diarization_audio", ("",)),
    ],
)
def test_nemotron_audio_attention_stays_multi_head(model_type, paths):
    """Their attention projects the values for every head: a grouped-query tiny config broke their export."""
    config = tiny_config(model_type)
    for path in paths:
        part = config
        for name in filter(None, path.split(".")):
            part = getattr(part, name)
        assert part.num_key_value_heads == part.num_attention_heads, (model_type, path)


def test_recurrent_gemmas_recurrent_width_is_its_width():
    """Its conv state has `hidden_size` channels and is fed `lru_width` ones: its eager decode step failed."""
    config = tiny_config("recurrent_gemma")
    assert config.lru_width == config.hidden_size
    assert check_eager("recurrent_gemma")["status"] == "ok"


def test_gemma4s_audio_tower_gets_as_many_mel_bins_as_its_first_convs_channels():
    """It names no bins: its projection reads `subsampling_conv_channels[0] // 4` frequency rows after two halvings.
    Its features run at the three audio lengths of the forward cases."""
    from exportsmith.verify.check import FORWARD_SHAPES

    _, cls = model_class("gemma4_audio")
    model = build_tiny_model(cls, config_for(cls, tiny_config("gemma4_audio")))
    bins = model.config.subsampling_conv_channels[0]
    shapes = [dummy_inputs(model, 0, shape)["input_features"].shape for shape in FORWARD_SHAPES]
    assert {shape[-1] for shape in shapes} == {bins} and len({shape[1] for shape in shapes}) == 3
    assert check_eager("gemma4_audio")["status"] == "ok"
