"""Tiny, deterministic configs for every model type, so that verification builds and runs a model in seconds.

`tiny_config(model_type)` starts from the model type's default config and rewrites its init fields (sub-configs
recursively, by the same rule; derived attributes are left for the config class to recompute):

- sizes by name (`SIZE_RULES`): widths -> 64, heads -> 4, kv heads -> 2, head dims -> 16 (so heads x head_dim =
  width), layer counts -> 2, feed-forward widths -> 128, vocabularies -> 128, experts -> 4 (top-2), image size 32
  with patch size 4, positions -> 128, ... A size only ever shrinks (min(default, tiny)), which keeps sizes that
  were equal (a projector's width and the text width) equal and small defaults (1 kv head) as they are;
- sizes bound by an equation are recomputed (`derived_sizes`): multi-latent attention keeps one kv head per head,
  state-space heads x head dim = expand x width, partial rotary dims and rope `mrope_section`s follow the head dim;
- per-layer lists (`layer_types`, `block_types`, per-layer sizes, ...) are cut to the layer count, keeping each
  distinct kind that fits; layer indices and counts of special layers are mapped onto the new layers; per-stage
  width lists are scaled together (the widest to 64), per-stage depths to 1;
- special token ids (pad/bos/eos/image/audio/video/..., `decoder_start_token_id`) become distinct small ids in
  the vocabulary, equal where they were equal (below `SPECIAL_IDS`: dummy text tokens are drawn above them);
- timm backbones become transformers' ResNet (timm is optional), pretrained-backbone flags go off;
- `MODEL_OVERRIDES` then sets, per model type, what the generic rule cannot know (a comment each saying why).

`build_tiny_model(model_class, config)` refuses (`TooLarge`) a model whose parameters and buffers, counted on the
`meta` device before anything is allocated, exceed `MAX_PARAMS`; otherwise it builds it with seeded weights.
"""

import dataclasses
import inspect
import math
import re

import torch
from transformers import PretrainedConfig
from transformers.models.auto.configuration_auto import CONFIG_MAPPING, CONFIG_MAPPING_NAMES

HIDDEN_SIZE = 64
NUM_HEADS = 4
NUM_KV_HEADS = 2  # divides NUM_HEADS, so grouped-query attention paths are exercised
HEAD_DIM = HIDDEN_SIZE // NUM_HEADS
NUM_LAYERS = 2
VOCAB_SIZE = 128
SPECIAL_IDS = 32  # special token ids are mapped into [0, SPECIAL_IDS); ordinary text tokens are drawn above
IMAGE_SIZE = 32
PATCH_SIZE = 4
SLIDING_WINDOW = 9
MAX_POSITIONS = 128

# Refuse a tiny model with more parameters + buffers than this (float32: 200 MB) before it is built.
MAX_PARAMS = 50_000_000

# Integer init fields, by name (full match, first rule wins) -> the tiny value; the new value is
# min(default, tiny value), so a default that is already small stays as it is.
SIZE_RULES: tuple[tuple[str, int], ...] = (
    # vocabularies (also codebooks, which index embeddings the same way)
    (r"(\w+_)?vocab_size(_\w+)?|num_embeddings|codebook_size|num_codevectors_per_group|\w+_group_vocab", VOCAB_SIZE),
    # key/value heads before heads
    (
        r"(\w+_)?(num_key_value_heads|num_kv_heads|kv_n_heads|num_key_value_attention_heads|linear_num_key_heads)"
        r"(_per_layer)?",
        NUM_KV_HEADS,
    ),
    (
        r"(\w+_)?(num_attention_heads|num_heads|n_heads?|attention_heads|num_\w+_heads|\w+_n_heads|\w+_num_heads)",
        NUM_HEADS,
    ),
    (r"(\w+_)?(head_dim|d_kv|dim_head|d_head|attention_head_size|kv_channels|head_size)", HEAD_DIM),
    # layer counts (other counts of layers, such as `first_k_dense_replace`, are per-layer indices: see below)
    (
        r"(\w+_)?(num_hidden_layers|num_layers|n_layers?|encoder_layers|decoder_layers|num_encoder_layers|"
        r"num_decoder_layers|depth|num_blocks)",
        NUM_LAYERS,
    ),
    # feed-forward widths
    (
        r"(\w+_)?(moe_intermediate_size|expert_intermediate_size|moe_hidden_size|expert_ffn_hidden_size)",
        HIDDEN_SIZE // 2,
    ),
    (
        r"(\w+_)?(intermediate_size|d_ff|ffn_dim|n_inner|dim_feedforward|feedforward_dim|ffn_hidden_size|mlp_dim|"
        r"d_inner|intermediate_size_mlp|feed_forward_size|linear_units)",
        2 * HIDDEN_SIZE,
    ),
    # widths
    (
        r"(\w+_)?(hidden_size|d_model|n_embd|embed_dim|hidden_dim|embedding_size|projection_dim|proj_dim|d_latents|"
        r"embedding_dim|model_dim|channels|output_hidden_size|word_embed_proj_dim|q_lora_rank|kv_lora_rank|"
        r"codebook_dim|emb_dim|adapter_in_dim|adapter_out_dim|adapter_input_size|condition_dim|"
        r"vector_quantization_hidden_dimension|vit_dim|pooler_output_size|hidden_size_global|"
        r"upsample_initial_channel)|dim",
        HIDDEN_SIZE,
    ),
    # sine position features, half of them sines and half cosines, add up to the width
    (r"num_pos_feats", HIDDEN_SIZE // 2),
    # depthwise (per-channel) upsampling of a codec's decoder: one group per channel of the width
    (r"upsample_groups", HIDDEN_SIZE),
    # mixture of experts
    (r"num_local_experts|num_experts|n_routed_experts|moe_num_experts|num_routed_experts", 4),
    (r"num_experts_per_tok|num_experts_per_token|moe_topk|moe_k|moe_top_k|top_k", 2),
    (r"n_shared_experts|num_shared_experts|moe_num_shared_experts", 1),
    (r"n_group|num_expert_group", 2),
    (r"topk_group", 1),
    # positions and lengths
    (r"(\w+_)?(max_position_embeddings|n_positions|n_ctx|max_source_positions|max_target_positions)", MAX_POSITIONS),
    # a window the verification lengths fall on both sides of (examples fit in it; long cases reach 17)
    (r"sliding_window", SLIDING_WINDOW),
    # vision (video: 4 frames, two tubelets of 2)
    (r"image_size|img_size|pretrain_image_size", IMAGE_SIZE),
    (r"patch_size", PATCH_SIZE),
    (r"num_frames|frames_per_clip", 4),
    # conv stacks that double a base number of filters at every stage
    (r"num_filters", 8),
    # windows an image is split into (a square number whose side divides the patch grid)
    (r"num_windows", 4),
    # state-space models (their head count follows from the widths: see derived_sizes)
    (r"mamba_d_state|state_size|ssm_state_size|d_state", 16),
    (r"n_groups|mamba_n_groups|mamba_ngroups", 1),
    (r"(\w+_)?dt_rank|time_step_rank", 8),
    # group norms divide the smallest per-stage width (8)
    (r"num_groups", 4),
    # detector queries picked by top-k among the image tokens: fewer than a 32 x 32 image's smallest feature maps give
    (r"num_queries", 16),
    # image tokens pooled from the patch grid: a square that divides the (IMAGE_SIZE / PATCH_SIZE)^2 grid
    (r"mm_tokens_per_image", 16),
)

# Sizes whose default None some modeling code reads as if it were set.
NONE_DEFAULTS = {
    "head_dim": HEAD_DIM,
    "num_key_value_heads": NUM_KV_HEADS,
    "vocab_size": VOCAB_SIZE,
    "num_experts_per_tok": 2,
}

# Flags that would load an optional package (timm) or download weights.
OFF_FLAGS = ("use_timm_backbone", "use_pretrained_backbone")

# Lists of sizes, one per stage or per conv layer, by name: each entry is rescaled (see `shrink_width_list`).
WIDTH_LISTS = re.compile(
    r"(\w+_)?(hidden_sizes|embed_dims?|conv_dim|channels|hidden_dims|out_channels|in_channels|neck_hidden_sizes|"
    r"out_features|embedding_sizes|dims)"
)
HEAD_LISTS = re.compile(r"num_heads|num_attention_heads|heads")
DEPTH_LISTS = re.compile(
    r"depths|num_layers|layers_per_stage|block_counts|encoder_layers|decoder_layers|num_block_repeats|block_repeats"
)
# "every n-th layer from layer k": n becomes at most NUM_LAYERS and k one of the new layers.
LAYER_PERIOD = re.compile(r"\w*layer_period|\w*layer_interval|\w*layer_freq|\w*sparse_step|\w*layer_step")
LAYER_OFFSET = re.compile(r"\w*layer_offset")
# Lists of layer kinds, cycled over the layers when shorter than them.
LAYER_PATTERN = re.compile(r"\w*_types?|layers_block_types?")
# Lists of layer (or hidden-state) indices.
LAYER_INDICES = re.compile(r"\w*layers?\w*|out_indices|\w*indexes|\w*hook_ids")
# Counts of special layers among the main ones (first k dense, last n sharing kv, ...): mapped onto the new layers.
LAYER_COUNT = re.compile(r"\w*layers?\w*|first_k_dense_replace")

# Special token ids: `*_token_id`, `*_token_index`, plus a few names that do not say so.
TOKEN_ID = re.compile(
    r"\w*token_id|\w*token_index|\w*_token_ids|decoder_start_token_id|im_(start|end|newline)_id|"
    r"codec_\w+_id|audio_stream_(bos|eos)_id|tag_pad_id|subs_pad_id"
)
FIRST_TOKEN_IDS = ("pad_token_id", "bos_token_id", "eos_token_id")  # -> 0, 1, 2 when distinct

EFFICIENTNET_B0 = {
    "width_coefficient": 1.0,
    "depth_coefficient": 1.0,
    "in_channels": [32, 16, 24, 40, 80, 112, 192],
    "out_channels": [16, 24, 40, 80, 112, 192, 320],
    "hidden_dim": 1280,
}

# SAM 2's Hiera backbone: four stages of one block, doubling the width up to the tiny width (a stage change is told
# by the change of width), global attention in the first block (the others pool queries, which a global block
# cannot), windows of at least twice the query stride (a stage change pools the last stage's window), and the neck's
# view of it. Its per-stage lists have no generic rule.
HIERA = {
    "hidden_size": HIDDEN_SIZE // 8,
    "embed_dim_per_stage": [HIDDEN_SIZE // 8, HIDDEN_SIZE // 4, HIDDEN_SIZE // 2, HIDDEN_SIZE],
    "num_attention_heads_per_stage": [1, 1, 2, 2],
    "blocks_per_stage": [1, 1, 1, 1],
    "window_size_per_stage": [4, 4, 2, 2],
    "global_attention_blocks": [0],
    "window_positional_embedding_background_size": [2, 2],
}
HIERA_NECK = {
    "backbone_channel_list": HIERA["embed_dim_per_stage"][::-1],
    "backbone_feature_sizes": [[8, 8], [4, 4], [2, 2]],  # the first three stages of a 32 x 32 image, strides 4, 8, 16
}


def prefixed(prefix: str, values: dict) -> dict:
    return {f"{prefix}{name}": value for name, value in values.items()}


SAM2 = {
    **prefixed("vision_config.backbone_config.", HIERA),
    **prefixed("vision_config.", HIERA_NECK),
    # prompts are embedded on the grid of the image embeddings: the third stage, stride 16
    "prompt_encoder_config.patch_size": 16,
}


COMPASS_ROPE = {"full_attention": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}}

DEEPSEEK_OCR2_TEXT = {"mlp_layer_types": ["dense", "sparse"], "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1}

# Qwen4-exp's sparse-attention indexer (heads, head dim, token budget and compression), unset by default: sizes that
# follow the tiny attention and keep a top-k over the 8-token examples.
QWEN4_INDEXER = {
    "indexer_n_heads": NUM_HEADS,
    "indexer_kv_heads": 1,  # its validator requires one
    "indexer_head_dim": HEAD_DIM,
    "indexer_budget": 8,
    "indexer_compress_ratio": 2,
}

# PP-OCR's intra-class blocks (unset by default, the checkpoints set them): (kernel, stride, padding) of each conv,
# every one keeping the feature map's size: square, tall and wide kernels of 7, 5 and 3 (as PP-OCR's IntraCLBlock),
# 1 x 1 in and out.
INTRACLASS_BLOCK = {
    "reduce_channel": [1, 1, 0],
    "return_channel": [1, 1, 0],
    "symmetric_conv_long_longratio": [[7, 7], 1, [3, 3]],
    "vertical_long_to_small_conv_longratio": [[7, 1], 1, [3, 0]],
    "horizontal_small_to_long_conv_longratio": [[1, 7], 1, [0, 3]],
    "symmetric_conv_long_midratio": [[5, 5], 1, [2, 2]],
    "vertical_long_to_small_conv_midratio": [[5, 1], 1, [2, 0]],
    "horizontal_small_to_long_conv_midratio": [[1, 5], 1, [0, 2]],
    "symmetric_conv_long_shortratio": [[3, 3], 1, [1, 1]],
    "vertical_long_to_small_conv_shortratio": [[3, 1], 1, [1, 0]],
    "horizontal_small_to_long_conv_shortratio": [[1, 3], 1, [0, 1]],
}

# Per model type, only where the generic rule cannot work: a path of init fields ("text_config.hidden_size") ->
# value, applied after it.
MODEL_OVERRIDES: dict[str, dict[str, object]] = {
    # The defaults have no attention layer at all, and the causal mask then asks a cache of linear-attention layers
    # only for its length: give the second layer attention.
    "bamba": {"attn_layer_indices": [1]},
    "granitemoehybrid": {"layer_types": ["linear_attention", "full_attention"]},
    # The defaults lack attributes the modeling code reads (the default model does not build either).
    "qwen3_omni_moe": {
        "talker_config.text_config.shared_expert_intermediate_size": 2 * HIDDEN_SIZE,
        "talker_config.spatial_merge_size": 2,  # the vision tower's
        "thinker_config.vision_start_token_id": SPECIAL_IDS - 1,  # an unused special id
    },
    "qwen3_omni_moe_talker_text": {"shared_expert_intermediate_size": 2 * HIDDEN_SIZE},
    # Attributes that the composite config sets on its parts, read by the part's modeling code when it is built alone.
    "t5gemma2_text": {"dropout_rate": 0.0},
    "t5gemma2_decoder": {"dropout_rate": 0.0},
    "t5gemma2_encoder": {"text_config.dropout_rate": 0.0},
    "pix2struct_text_model": {"initializer_range": 0.02},
    # Its rotary embedding reads attn_config.rope_theta, which the attention config does not define, and its
    # attention clamps to clip_qkv unconditionally (8, as the released checkpoints).
    "dbrx": {"attn_config.rope_theta": 10000.0, "attn_config.clip_qkv": 8.0},
    # Its attention views queries with num_key_value_heads: kv heads must equal heads.
    "moonshine": {"encoder_num_key_value_heads": NUM_HEADS, "decoder_num_key_value_heads": NUM_HEADS},
    # Its position ids count the tokens that are not padding: it needs a padding id, which the default leaves unset.
    "esm": {"pad_token_id": 0},
    # Its model builds a sliding-window mask whatever its layer types, and the default window is unset.
    "step3p5": {"sliding_window": SLIDING_WINDOW},
    "step3p7": {"text_config.sliding_window": SLIDING_WINDOW},
    # Its rotary embedding splits by an mrope_section that defaults (in the modeling code) to one for head dim 128.
    "paddleocr_vl_text": {"rope_parameters.mrope_section": [2, 3, 3]},
    # The image placeholder is left unset (the processor sets it) but the model looks for it in input_ids.
    "blip-2": {"image_token_index": SPECIAL_IDS - 1},
    "instructblip": {"image_token_index": SPECIAL_IDS - 1},
    # (its 4 frames x 32 queries would overrun the 128 positions of the tiny text model: 8 queries)
    "instructblipvideo": {"video_token_index": SPECIAL_IDS - 1, "num_query_tokens": 8},
    # Five vision layers (counted from both ends of a 24-layer tower) feed its projector: five of the tiny tower's.
    "vipllava": {"vision_feature_layers": [-2, -3, -1, -2, 1]},
    # Kolibri 1.1 (5.25): index_layers (indexers among the indexed-attention layers) and kv_source_layers (whose K/V
    # each layer reads) spread over 2 layers collapse into repeats its validator refuses; three layers keep each kind:
    # a sliding layer, an indexer, and a reindexer reading the indexer's K/V.
    "kolibri1_1": {
        "num_hidden_layers": 3,
        "layer_types": ["sliding_attention", "indexed_attention", "indexed_attention"],
        "index_layers": [1],
        "kv_source_layers": [0, 1, 1],
        "mlp_only_layers": [0],
        "index_num_heads": 2,  # at most the query heads of a key head (4 / 2)
        # an indexer that selects among fewer keys than the longest case has: sink, local and top-k all matter
        "index_topk": 4,
        "index_pool_size": 8,
        "index_compression": 2,
        "index_num_local_tokens": 2,
        "index_num_sink_tokens": 1,
    },
    # Its cache has one slot per layer call: num_layers_per_stack (1) x H_cycles (2) x (L_cycles (3) + 1).
    "hrm_text": {"num_hidden_layers": 8},
    # Its hybrid layers share one transformer block, tied from the second hybrid layer on: it needs two of them. The
    # block's width is twice the model's (it sees the embeddings too): left for the config to derive.
    "zamba": {
        "num_hidden_layers": 3,
        "layers_block_type": ["hybrid", "linear_attention", "hybrid"],
        "attention_hidden_size": None,
        "attention_head_dim": None,
    },
    # Rope parameters per layer type, empty by default; the modeling default mrope_section is for head dim 128.
    "cohere_compass_text": {"rope_parameters": COMPASS_ROPE},
    "cohere_compass": {"text_config.rope_parameters": COMPASS_ROPE},
    # Its layout embeddings are six of hidden_size // 6 wide, added to the text's: the width must divide by 6.
    "lilt": {"hidden_size": 48},
    # Its 2-D position embeddings (4 coordinates, 2 shape sizes) are concatenated to the width: 4 x 10 + 2 x 12 = 64.
    "layoutlmv3": {"coordinate_size": 10, "shape_size": 12},
    # The thinker's rope index reads a vision start token that only the composite config defines.
    "qwen2_5_omni_thinker": {"vision_start_token_id": SPECIAL_IDS - 2},
    # Mixture-of-experts and layer-kind fields whose defaults are unset (each released checkpoint sets them) and that
    # the modeling code reads unconditionally.
    "dots1": {"n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1},
    "diffusion_gemma_text": {"num_experts": 4, "top_k_experts": 2, "moe_intermediate_size": HIDDEN_SIZE // 2},
    "diffusion_gemma": {
        "text_config.num_experts": 4,
        "text_config.top_k_experts": 2,
        "text_config.moe_intermediate_size": HIDDEN_SIZE // 2,
    },
    "lfm2_moe": {"layer_types": ["conv", "full_attention"]},
    # One expert by default (the released checkpoints have 64, top-8), which the tiny sizes only shrink: one expert
    # is not a mixture, and transformers' experts then count tokens with `histc(min=0, max=0)`, the data's range.
    "hunyuan_v1_moe": {"num_experts": 4, "moe_topk": 2},
    "qwen4_exp_text": QWEN4_INDEXER,
    "qwen4_exp": prefixed("text_config.", QWEN4_INDEXER),
    "deepseek_ocr2_text": DEEPSEEK_OCR2_TEXT,
    "deepseek_ocr2": prefixed("text_config.", DEEPSEEK_OCR2_TEXT),
    # Its axial position embeddings split the width (16 + 48) over a grid of positions (4 x 4) that the attention
    # chunks (4 tokens) divide.
    "reformer": {
        "axial_pos_embds_dim": [16, 48],
        "axial_pos_shape": [4, 4],
        "local_attn_chunk_length": 4,
        "lsh_attn_chunk_length": 4,
    },
    # Its validator refuses grouped-query attention.
    "esmc": {"num_key_value_heads": NUM_HEADS},
    # `attention_layers` (derived) must have one entry per layer; it is built from these (pattern, repeats) pairs.
    "gpt_neo": {"attention_types": [[["global", "local"], 1]]},
    # Four stages of windowed attention halve a 16-patch grid down to one 2 x 2 window; with 32 / 4 = 8 patches
    # the last stage is smaller than any window.
    "swin": {"image_size": 2 * IMAGE_SIZE, "window_size": 2},
    "donut-swin": {"image_size": 2 * IMAGE_SIZE, "window_size": 2},
    # The stem (32) and head (1280) widths are constants of the modeling code, scaled only by width_coefficient:
    # keep the B0 stage widths, and B0's coefficients instead of the default B7's.
    # The feature-map sizes the mask decoder reshapes to: the patch grid (32 / 4 = 8) upscaled x4, x2, x1.
    "sam3_tracker": {"vision_config.backbone_feature_sizes": [[32, 32], [16, 16], [8, 8]]},
    "sam2_hiera_det_model": HIERA,
    "sam2_vision_model": {**prefixed("backbone_config.", HIERA), **HIERA_NECK},
    "sam2": SAM2,
    # the video trackers built on SAM 2's Hiera tower (EdgeTAM's video model too, by default)
    "sam2_video": SAM2,
    # (its perceiver resampler adds a position encoding of the full width to each head's keys: one head of it; its
    # 2-D latents are one per window of the memory's 2 x 2 grid, stride 16)
    "edgetam_video": {
        **SAM2,
        "perceiver_resampler_attention_head_dim": HIDDEN_SIZE,
        "perceiver_resampler_num_latents_2d": 4,
    },
    # Forecasters whose horizon has no default (a dataset sets it); the context defaults to the horizon.
    "time_series_transformer": {"prediction_length": 4},
    "informer": {"prediction_length": 4},
    "autoformer": {"prediction_length": 4},
    "efficientnet": EFFICIENTNET_B0,
    # ALIGN's vision tower is an EfficientNet-B7: the same B0 widths and coefficients; the text projection matches
    # the image embeddings (the last stage's width).
    "align_vision_model": EFFICIENTNET_B0,
    "align": {
        **{f"vision_config.{name}": value for name, value in EFFICIENTNET_B0.items()},
        "projection_dim": EFFICIENTNET_B0["out_channels"][-1],
    },
    # Stems that downsample by a fixed 16 whatever `patch_size` says: the grid their position biases (LeViT) or the
    # matting decoder's fusion (ViTMatte's four stride-2 stages) are built for follows the real stride.
    "levit": {"patch_size": 16},
    "vitmatte": {"backbone_config.patch_size": 16},
    # The stem's width is the first stage's input (hidden_sizes[0], scaled to 8).
    "textnet": {"stem_out_channels": 8},
    # The metric head's bottleneck is the fused neck's output (fusion_hidden_size).
    "zoedepth": {"bottleneck_features": HIDDEN_SIZE},
    # The vision adapter's input is the tower's output after a 2 x 2 pixel shuffle: four tiny widths.
    "muse_glimmer": {"out_hidden_size": 4 * HIDDEN_SIZE},
    "muse_spark": {"out_hidden_size": 4 * HIDDEN_SIZE},
    # Its attention reads `num_key_value_heads` as the number of query heads (a multi-head model: they are equal).
    "moonshine_streaming": {"num_key_value_heads": NUM_HEADS},
    # The adapters are per language and the forward needs one: the first of `languages`.
    "xmod": {"default_language": "en_XX"},
    # DepthPro cuts the image, scaled down to a quarter at least, into patches of its towers' image size
    # (`patch_size`: a quarter of the tiny image) and taps two of their layers, by index among the tiny ones.
    "depth_pro": {"patch_size": IMAGE_SIZE // 4, "intermediate_hook_ids": [1, 0]},
    # Validators the generic rule does not know: Dory's input, recurrent and output layers add up to its layers (one
    # each); FunASR's adaptor is a quarter of the text width.
    # (serialized as attention and mlp blocks, two per layer: three layers are six blocks)
    "dory": {
        "num_hidden_layers": 6,
        "n_input_layers": 2,
        "n_recurrent_layers": 2,
        "n_output_layers": 2,
        "layer_types": ["sliding_attention", "mlp"] * 3,
    },
    "fun_asr_nano": {"adaptor_config.intermediate_size": HIDDEN_SIZE // 4},
    # Five stride-2 stages, then 2 x 2 patches unfolded: an image of 64 leaves them a 2 x 2 map.
    "mobilevitv2": {"image_size": 2 * IMAGE_SIZE},
    # ERNIE-4.5-VL interleaves the height and width rotary sections pairwise: they must be equal (its default is
    # [22, 22, 20] for a head of 128).
    "ernie4_5_vl_moe": {"text_config.rope_parameters.mrope_section": [3, 3, 2]},
    "ernie4_5_vl_moe_text": {"rope_parameters.mrope_section": [3, 3, 2]},
    # PaddleOCR-VL reads a default section for a head of 128 ([16, 24, 24]) unless the config has one.
    "paddleocr_vl": {"text_config.rope_parameters.mrope_section": [2, 3, 3]},
    # The audio tower's output is the text width (its `output_dim`, a name the width rule leaves alone).
    "qwen3_asr": {"audio_config.output_dim": HIDDEN_SIZE},
    # CLAP's audio Swin doubles its patch width at each of its (two tiny) stages up to the width it projects from.
    "clap": {"audio_config.patch_embeds_hidden_size": HIDDEN_SIZE // 2},
    # Granite Speech 5's encoder projects keys and values for every head but still repeats them by
    # heads / kv heads: multi-head only.
    "granite_speech5_encoder": {"num_key_value_heads": NUM_HEADS},
    "granite_speech5_ctc": {"encoder_config.num_key_value_heads": NUM_HEADS},
    # RecurrentGemma's recurrent block keeps its conv state with `hidden_size` channels and feeds it `lru_width` ones:
    # equal in every released configuration (2560 and 2560).
    "recurrent_gemma": {"lru_width": HIDDEN_SIZE},
    # Nemotron 3.5's audio attention projects the values for every head and views the keys with the heads' count:
    # multi-head only (every released configuration has as many key-value heads as heads).
    "nemotron3_5_transcribe_audio": {
        "asr_config.num_key_value_heads": NUM_HEADS,
        "diarization_config.audio_config.num_key_value_heads": NUM_HEADS,
    },
    "nemotron3_5_transcribe_asr_audio": {"num_key_value_heads": NUM_HEADS},
    "nemotron3_5_transcribe_word_timestamp": {"num_key_value_heads": NUM_HEADS},
    "nemotron3_diarization": {"audio_config.num_key_value_heads": NUM_HEADS},
    "nemotron3_diarization_audio": {"num_key_value_heads": NUM_HEADS},
    # xLSTM's cache sizes its matrix memory with the full head width for queries/keys: the defaults' half-width
    # keys (qk_dim_factor 0.5) fail the recurrent step's shape check.
    "xlstm": {"qk_dim_factor": 1.0},
    # Llama 4's vision adapter takes the pixel-shuffled width (four tiny widths at ratio 0.5) as its MLP's input.
    "llama4_vision_model": {
        "intermediate_size": 4 * HIDDEN_SIZE,
        "projector_input_dim": HIDDEN_SIZE,
        "projector_output_dim": HIDDEN_SIZE,
        "vision_output_dim": HIDDEN_SIZE,
    },
    # Aria's projector has a number of queries per image patch count: the tiny image's 8 x 8 patches.
    "aria": {"projector_patch_to_query_dict": {(IMAGE_SIZE // PATCH_SIZE) ** 2: 16}},
    # Placeholder ids its processor sets (the config leaves them None): an unused special id.
    "nemotron_h_omni": {"image_token_id": SPECIAL_IDS - 1},
    # Gemma 4's vision pooler averages k x k patches: a k that divides the tiny 8 x 8 patch grid.
    "gemma4_vision": {"pooling_kernel_size": 2},
    # SuperGlue matches SuperPoint's descriptors at its own width.
    "superglue": {"keypoint_detector_config.descriptor_decoder_dim": HIDDEN_SIZE},
    # X-Codec quantizes the acoustic features (DAC's width, derived from its tiny encoder: 256) and the semantic
    # ones (the tiny width) side by side.
    "xcodec": {"codebook_dim": 256 + HIDDEN_SIZE},
    # Janus' VQ encoder halves the image four times (five channel levels): `num_patches` per side of the tiny image.
    "janus_vqgan": {"num_patches": IMAGE_SIZE // 16},
    # PP-DocLayout V2 keeps a score threshold and a reading order per class, set by its checkpoints (None by
    # default): one each for its two default labels.
    "pp_doclayout_v2": {"class_thresholds": [0.5, 0.5], "class_order": [0, 1]},
    # CLVP's encoders rotate at least 32 dims of each head: heads of 32.
    "clvp_encoder": {"num_attention_heads": HIDDEN_SIZE // 32},
    "clvp": {
        "text_config.num_attention_heads": HIDDEN_SIZE // 32,
        "speech_config.num_attention_heads": HIDDEN_SIZE // 32,
    },
    # EfficientLoFTR's 2D rotary embedding spans half the width: head dim x factor = width / 2 (4 heads of 16).
    "efficientloftr": {"rope_parameters.partial_rotary_factor": HIDDEN_SIZE / 2 / HEAD_DIM},
    # Mllama's tower taps layers by index among its layers' outputs (no embeddings entry): five taps, of two layers.
    "mllama_vision_model": {"intermediate_layers_indices": [0, 0, 0, 1, 1]},
    # Molmo 2's tower has a position embedding per patch of its default image: one per tiny patch.
    "molmo2_vision": {"num_position_embeddings": (IMAGE_SIZE // PATCH_SIZE) ** 2},
    # Phi-4's audio conformer: its pointwise and depthwise-separable convolutions map the width to itself.
    "phi4_multimodal_audio": {"ext_pw_out_channel": HIDDEN_SIZE, "depthwise_separable_out_channel": HIDDEN_SIZE},
    # Apertus 1.5's vocabulary holds its text tokens, then the image codebook's, then the audio codebook's, back to
    # back (after the special ids): room for the two tiny codebooks.
    "apertus1p5": {
        "text_config.vocab_size": 3 * VOCAB_SIZE,
        "image_token_offset": VOCAB_SIZE // 2,
        "audio_token_offset": VOCAB_SIZE // 2 + VOCAB_SIZE,
    },
    # (with end tokens after the image and audio placeholders: its rope index steps over a start, the block and an
    # end)
    "qwen3_omni_moe_thinker": {
        "vision_start_token_id": SPECIAL_IDS - 2,
        "vision_end_token_id": SPECIAL_IDS - 3,
        "audio_end_token_id": SPECIAL_IDS - 4,
    },
    "pp_ocrv5_server_det": {"intraclass_block_config": INTRACLASS_BLOCK},
    "pp_ocrv6_medium_det": {"intraclass_block_config": INTRACLASS_BLOCK},
    # The DiT's speaker encoder (ECAPA-TDNN) aggregates its three middle blocks' channels into the last one's.
    "qwen2_5_omni_dit": {"enc_channels": [16, 16, 16, 16, 48]},
    # TVP pads its frames (of its largest size: see tasks.IMAGE_SIZES) with a learned frame of visual_prompt_size.
    "tvp": {"max_img_size": 2 * IMAGE_SIZE, "visual_prompt_size": PATCH_SIZE},
    # LW-DETR's projector scales (none by default, so no feature level at all): one level at the backbone's stride,
    # as its small checkpoints.
    "lw_detr": {"projector_scale_factors": [1.0]},
    # Moshi's depth decoder reads the main decoder's states: the tiny width.
    "moshi_depth": {"input_size": HIDDEN_SIZE},
    # UVDoc's bridge connector takes every bridge stage's output, concatenated: its backbone returns all six (the
    # default returns only the last, which the default model cannot run either).
    "uvdoc": {"backbone_config.out_indices": [1, 2, 3, 4, 5, 6]},
    # PP-DocLayout V3's mask head reads the backbone's stride-4 map: the tiny backbone's first stage width (8).
    "pp_doclayout_v3": {"x4_feat_dim": 8},
    # Codecs that quantize the acoustic and semantic features side by side (two tiny widths), whose rotary
    # attention applies to keys of every head (multi-head only).
    "xcodec2": {"quantization_dim": 2 * HIDDEN_SIZE, "num_key_value_heads": NUM_HEADS},
    "neucodec": {"quantization_dim": 2 * HIDDEN_SIZE, "num_key_value_heads": NUM_HEADS},
    # Molmo 2's adapter taps two layers of the tower, counted from its end.
    "molmo2": {
        "vision_config.num_position_embeddings": (IMAGE_SIZE // PATCH_SIZE) ** 2,
        "adapter_config.vision_feature_layer": [-1, -2],
        # its image placeholder (image_token_id) is stored as `image_patch_id`, a name the token-id rule misses
        "image_patch_id": SPECIAL_IDS - 1,
    },
    # ESMFold 2's language model is an ESMC, whose validator refuses grouped-query attention; its atom encoders'
    # 3-D rotary embedding packs 3 x 2 spatial + 10 id frequency pairs into half a head: heads of 32.
    "esmfold2": {
        "esmc_config.num_key_value_heads": NUM_HEADS,
        "atom_encoder.num_attention_heads": 2,
        "atom_encoder.head_dim": 2 * HEAD_DIM,
        "structure_head.diffusion_module.atom_encoder.num_attention_heads": 2,
        "structure_head.diffusion_module.atom_encoder.head_dim": 2 * HEAD_DIM,
        # the atom stacks scatter into the token transformers: their output is the tiny width
        "atom_encoder.output_dim": HIDDEN_SIZE,
        "structure_head.diffusion_module.atom_encoder.output_dim": HIDDEN_SIZE,
        # the token features: the atom stack's output, then two one-hot residue types (33 each) and one flag
        "single_inputs_size": HIDDEN_SIZE + 2 * 33 + 1,
    },
    # Its last num_kv_shared_layers layers reuse the cache of an earlier layer of their kind: three layers, so that
    # both kinds produce a cache before the third (sliding) one reuses one; sparsity follows the layers.
    "gemma3n_text": {
        "num_hidden_layers": 3,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
        "activation_sparsity_pattern": [0.95, 0.0, 0.0],
        "intermediate_size": [2 * HIDDEN_SIZE] * 3,
    },
    # Which vision layers feed which text layers (a checkpoint sets it; None by default): the tiny layers.
    "granite4_vision": {
        "deepstack_layer_map": [[-1, 0], [-2, 1]],
        "spatial_target_layers": [0, 1, 0, 1],
        # its window Q-Former's query / key window sides, on the 8 x 8 patch grid
        "downsample_rate": "1/2",
    },
}

# Init fields, per model type, without which even the default config fails its own validator (the released
# checkpoints set them): the defaults that the tiny rule starts from are built with them.
DEFAULT_FIELDS: dict[str, dict[str, object]] = {
    # The assistant drafter reads the target model's per-layer inputs: its validator wants none of its own.
    "gemma4_assistant": {
        "text_config": {
            "hidden_size_per_layer_input": 0,
            "vocab_size_per_layer_input": 0,
            "enable_moe_block": False,
            "use_double_wide_mlp": False,
        }
    },
}


class TooLarge(Exception):
    """A tiny model that would still exceed MAX_PARAMS; raised before it is built."""


def tiny_config(model_type: str) -> PretrainedConfig:
    """A tiny config of `model_type` (widths 64, 4 heads of 16, 2 kv heads, 2 layers, 128 vocab, 4 experts top-2)."""
    if model_type not in CONFIG_MAPPING_NAMES:
        raise ValueError(f"unknown model type {model_type!r} (not in transformers' CONFIG_MAPPING_NAMES)")
    config_class = CONFIG_MAPPING[model_type]
    token_ids = TokenIds()
    default = config_class(**DEFAULT_FIELDS.get(model_type, {}))
    fields = shrink_config_fields(config_class, default.to_dict(), token_ids, top_level=True)
    for path, value in MODEL_OVERRIDES.get(model_type, {}).items():
        set_path(fields, path, value)
    config = config_class(**fields)
    image_size = getattr(config_class, "image_size", None)
    if isinstance(image_size, property) and image_size.fset is not None:
        # a config whose image size is a property that sets it on its parts with the sizes that follow from it (SAM
        # 3's video model: tracker and detector, feature-map and rope sizes), set as its docs do
        config.image_size = IMAGE_SIZE
    return config


def init_fields(config_class: type) -> set[str]:
    """The fields a config class takes when built: its dataclass init fields (transformers 5.x), else (4.x configs
    are plain classes) the named parameters of every `__init__` along its MRO, `PretrainedConfig`'s included."""
    if dataclasses.is_dataclass(config_class):
        return {field.name for field in dataclasses.fields(config_class) if field.init}
    names = set()
    for cls in config_class.__mro__:
        if "__init__" in vars(cls) and cls is not object:
            for parameter in inspect.signature(cls.__init__).parameters.values():
                if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY):
                    names.add(parameter.name)
    names.discard("self")
    return names


def init_names(config_class: type, values: dict, fields: set[str]) -> dict:
    """`values` with each attribute that `to_dict` lists under its stored name but the class takes under an
    attribute_map alias (a field `num_hidden_layers` stored as `n_layers`) renamed to that init field, so the
    field is shrunk like any other instead of dropped with the attributes the class derives."""
    renamed = {
        stored: alias
        for alias, stored in getattr(config_class, "attribute_map", {}).items()
        if alias in fields and stored not in fields and stored in values and alias not in values
    }
    return {renamed.get(name, name): value for name, value in values.items()}


def sub_config_class(config_class: type, name: str, values: dict) -> type:
    """The config class a nested config dict is built into: its `model_type`'s, else the parent's sub_configs'."""
    if values.get("model_type") in CONFIG_MAPPING:
        return CONFIG_MAPPING[values["model_type"]]
    return config_class.sub_configs[name]


def is_sub_config(config_class: type, name: str, value) -> bool:
    return isinstance(value, dict) and ("model_type" in value or name in getattr(config_class, "sub_configs", {}))


def shrink_config_fields(config_class: type, values: dict, token_ids: "TokenIds", top_level: bool = False) -> dict:
    """The init fields of `values` (a config's to_dict), shrunk; sub-config dicts recursively.

    Attributes the config class derives itself are dropped (it recomputes them from the tiny fields); a sub-config
    keeps the extra attributes its parent's defaults give it (the class alone would not set them)."""
    fields = init_fields(config_class)
    values = init_names(config_class, values, fields)
    derived = set(values) if top_level else set(config_class().to_dict())
    listed = values
    values = {name: value for name, value in values.items() if name in fields or name not in derived}
    old_layers = layer_count(values)
    small_vocab = isinstance(values.get("vocab_size"), int) and values["vocab_size"] <= SPECIAL_IDS
    # widths also listed per block in `block_configs` (nested lists no rule rewrites) must stay as they are
    width_scale = None if "block_configs" in values else shared_width_scale(values)
    shrunk = {}
    for name, value in values.items():
        if is_sub_config(config_class, name, value):
            if value.get("model_type") == "timm_backbone":
                value = resnet_backbone(value)
            sub_class = sub_config_class(config_class, name, value)
            shrunk[name] = {**shrink_config_fields(sub_class, value, token_ids), "model_type": sub_class.model_type}
        elif TOKEN_ID.fullmatch(name) and not small_vocab:
            shrunk[name] = token_ids.map(name, value)
        elif TOKEN_ID.fullmatch(name):
            shrunk[name] = value  # ids of a vocabulary smaller than the special ids (a few markers) stay in it
        else:
            shrunk[name] = shrink_value(name, value, old_layers, width_scale)
    derived_sizes(config_class, values, shrunk)
    backbone_outputs(listed, shrunk)
    return shrunk


def resnet_backbone(timm_backbone: dict) -> dict:
    """transformers' own ResNet with the same output stages, for a timm backbone (timm is an optional package that
    a verification machine need not have)."""
    resnet = CONFIG_MAPPING["resnet"]().to_dict()
    if timm_backbone.get("out_indices") is not None:
        resnet["out_indices"] = list(timm_backbone["out_indices"])
        resnet.pop("out_features", None)
    return resnet


MAMBA_HEADS = ("mamba_n_heads", "mamba_num_heads", "n_mamba_heads", "num_heads")
MAMBA_HEAD_DIMS = ("mamba_d_head", "mamba_head_dim", "mamba_headdim", "head_dim")


def derived_sizes(config_class: type, values: dict, shrunk: dict) -> None:
    """Sizes that must satisfy an equation with others, recomputed from the tiny ones (in place)."""
    head_dim = old_head_dim(values)
    for name, tiny in NONE_DEFAULTS.items():
        if name in shrunk and shrunk[name] is None:  # "derive it" defaults that some models never derive
            shrunk[name] = tiny
    if "kv_lora_rank" in values and isinstance(shrunk.get("num_key_value_heads"), int):
        # multi-latent attention: keys and values are per head, none are shared
        shrunk["num_key_value_heads"] = shrunk.get("num_attention_heads", NUM_HEADS)
    if all(isinstance(shrunk.get(name), int) for name in ("qk_head_dim", "qk_nope_head_dim", "qk_rope_head_dim")):
        # multi-latent attention: a query/key head is its position-free part and its rotary part
        shrunk["qk_head_dim"] = shrunk["qk_nope_head_dim"] + shrunk["qk_rope_head_dim"]
    if isinstance(shrunk.get("rotary_dim"), int) and head_dim:  # a partial rotary dim keeps its share of the head
        shrunk["rotary_dim"] = max(2, 2 * round(values["rotary_dim"] * HEAD_DIM / head_dim / 2))
    expand = next((shrunk[name] for name in ("mamba_expand", "expand") if isinstance(shrunk.get(name), int)), None)
    hidden = shrunk.get("hidden_size")
    if expand and isinstance(hidden, int):  # state-space mixers: heads x head dim = expand x hidden size
        heads = next((name for name in MAMBA_HEADS if isinstance(shrunk.get(name), int)), None)
        dim = next((name for name in MAMBA_HEAD_DIMS if isinstance(shrunk.get(name), int)), None)
        if heads and dim:
            shrunk[heads] = max(1, expand * hidden // shrunk[dim])
        if isinstance(shrunk.get("mamba_d_ssm"), int):
            shrunk["mamba_d_ssm"] = expand * hidden
    if "rope_parameters" in shrunk:
        shrunk["rope_parameters"] = shrink_rope(shrunk["rope_parameters"], head_dim)
        if "mrope_section" in getattr(config_class, "ignore_keys_at_rope_validation", ()):
            insert_mrope_section(shrunk)


def insert_mrope_section(shrunk: dict) -> None:
    """A multimodal-rope config without `mrope_section` gets one for HEAD_DIM: the modeling default is for the
    default head dim (Qwen2-VL's [16, 24, 24] for 128), which no tiny head fits."""
    rope = shrunk["rope_parameters"]
    if not isinstance(rope, dict) or "mrope_section" in rope:
        return
    factor = rope.get("partial_rotary_factor", shrunk.get("partial_rotary_factor", 1.0)) or 1.0
    rope["mrope_section"] = split_proportionally([2, 3, 3], max(3, round(HEAD_DIM * factor / 2)))


LAYER_COUNT_NAMES = (
    "num_hidden_layers",
    "num_layers",
    "n_layer",
    "n_layers",
    "decoder_layers",
    "encoder_layers",
    "depth",
)


def layer_count_name(values: dict) -> str | None:
    """The first main layer-count field of one config dict."""
    for name in LAYER_COUNT_NAMES:
        if isinstance(values.get(name), int) and not isinstance(values[name], bool):
            return name
    return None


def layer_count(values: dict) -> int | None:
    """The default number of layers of one config dict (its first main layer-count field)."""
    name = layer_count_name(values)
    return values[name] if name else None


def backbone_outputs(values: dict, shrunk: dict) -> None:
    """A backbone's `out_indices` (which stages it returns), kept as many as they were: a neck or a detector has one
    input per returned stage. `to_dict` lists them but they are not init fields, so they are passed on explicitly
    (`out_features` and `stage_names` are derived from them). A stack of layers (`stage_names` one per layer + the
    stem) that returns more distinct layers than NUM_LAYERS keeps that many layers, returning them in order;
    per-stage backbones keep their stages, hence their indices."""
    old = values.get("out_indices")
    if not is_int_list(old):
        return
    shrunk.pop("out_features", None)
    shrunk.pop("stage_names", None)
    count_name, stage_names = layer_count_name(values), values.get("stage_names")
    if count_name is None or not isinstance(stage_names, list) or len(stage_names) != values[count_name] + 1:
        shrunk["out_indices"] = list(old)
        return
    distinct = sorted(set(old))
    if len(distinct) <= NUM_LAYERS:
        shrunk["out_indices"] = shrink_list_items("out_indices", old, values[count_name], 1.0)
        return
    shrunk[count_name] = len(distinct)
    first = 1 if distinct[0] > 0 else 0  # 0 is the stem (embeddings); it stays where it is asked for
    shrunk["out_indices"] = [distinct.index(index) + first for index in old]


def old_head_dim(values: dict) -> int | None:
    """The default head dim of one config dict: explicit, else width / heads (under any of their usual names)."""
    if isinstance(values.get("head_dim"), int):
        return values["head_dim"]
    width = next(
        (values[name] for name in ("hidden_size", "n_embd", "d_model") if isinstance(values.get(name), int)), 0
    )
    heads = next((values[name] for name in ("num_attention_heads", "n_head", "num_heads") if values.get(name)), None)
    return width // heads if isinstance(heads, int) and width else None


def size_rule(name: str) -> int | None:
    for pattern, tiny in SIZE_RULES:
        if re.fullmatch(pattern, name):
            return tiny
    return None


def shrink_value(name: str, value, old_layers: int | None, width_scale: float | None):
    """The tiny value of one (non-sub-config, non-token-id) init field."""
    if name in OFF_FLAGS:
        return False if value else value
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        tiny = size_rule(name)
        if tiny is not None and value > 0:
            return min(value, tiny)
        if LAYER_PERIOD.fullmatch(name):
            return min(value, NUM_LAYERS)
        if LAYER_OFFSET.fullmatch(name):
            return value % NUM_LAYERS
        if old_layers and LAYER_COUNT.fullmatch(name) and NUM_LAYERS < value <= old_layers:
            return remap_layer_index(value, old_layers)
        return value
    if isinstance(value, list) and value:
        return shrink_list(name, value, old_layers, width_scale)
    return value


def remap_layer_index(index: int, old_layers: int) -> int:
    """A layer index or count of `old_layers` mapped onto NUM_LAYERS: 0 stays 0, anything above 0 stays above."""
    return min(NUM_LAYERS, max(1, math.floor(index * NUM_LAYERS / old_layers))) if index else 0


def shrink_list(name: str, value: list, old_layers: int | None, width_scale: float | None) -> list:
    """The tiny value of a list field: its items shrunk by kind, then one per tiny layer if it had one per layer."""
    shrunk = shrink_list_items(name, value, old_layers, width_scale)
    if old_layers and len(shrunk) == old_layers > NUM_LAYERS:  # one entry per layer (or per stage, counted as layers)
        return shrunk[:NUM_LAYERS] if is_int_list(shrunk) else pick_layers(shrunk)
    return shrunk


def shrink_list_items(name: str, value: list, old_layers: int | None, width_scale: float | None) -> list:
    ints = is_int_list(value)
    if ints and WIDTH_LISTS.fullmatch(name):
        return value if width_scale is None else shrink_width_list(value, width_scale)
    if ints and HEAD_LISTS.fullmatch(name):  # per-stage heads: the same everywhere, or doubling with the widths
        return (
            [NUM_HEADS] * len(value)
            if len(set(value)) == 1
            else [min(item, 2**stage) for stage, item in enumerate(value)]
        )
    if ints and DEPTH_LISTS.fullmatch(name):
        return [min(item, 1) for item in value]
    if ints and size_rule(name) == IMAGE_SIZE:  # (height, width)
        return [min(item, IMAGE_SIZE) for item in value]
    if old_layers and len(value) == old_layers:
        tiny = size_rule(name)
        return [min(item, tiny) if tiny and type(item) is int else item for item in value]
    if LAYER_PATTERN.fullmatch(name) and all(isinstance(item, str) for item in value) and len(value) > NUM_LAYERS:
        return pick_layers(value)  # a pattern of layer kinds repeated over the layers: keep each kind that fits
    if name.endswith("pinpoints") and all(is_int_list(item) for item in value):
        # resolutions that images are tiled to: multiples of the vision tower's image size
        base = min(min(item) for item in value)
        return [[size * IMAGE_SIZE // base for size in item] for item in value]
    if ints and old_layers and LAYER_INDICES.fullmatch(name) and all(0 <= item <= old_layers for item in value):
        # indices of layers (or of hidden states, 0 being the embeddings): as many, spread over the new layers
        return [min(NUM_LAYERS, math.ceil(item * NUM_LAYERS / old_layers)) for item in value]
    return value


def is_int_list(value) -> bool:
    return isinstance(value, list) and bool(value) and all(type(item) is int for item in value)


def shared_width_scale(values: dict) -> float:
    """One scale for all per-stage width lists of a config dict (one stage's output is the next one's input), so
    that the widest becomes HIDDEN_SIZE (the last stage's width often is the config's hidden size)."""
    widths = [max(value) for name, value in values.items() if is_int_list(value) and WIDTH_LISTS.fullmatch(name)]
    return min(1.0, HIDDEN_SIZE / max(widths)) if widths and max(widths) > 0 else 1.0


def shrink_width_list(widths: list[int], scale: float) -> list[int]:
    """Per-stage widths: equal ones stay equal (HIDDEN_SIZE); others scaled, each a multiple of 8 (so group norms and
    head splits still divide them); image channel counts (<= 4, a stem's input) stay."""
    if len(set(widths)) == 1:
        return [min(widths[0], HIDDEN_SIZE)] * len(widths)
    return [max(8, int(round(width * scale / 8)) * 8) if width > 4 else width for width in widths]


def pick_layers(items: list) -> list:
    """NUM_LAYERS items of a per-layer list, in order: the first, then a different kind (full attention first: the
    causal mask of a hybrid model needs one attention layer), then the rest in order."""
    different = [index for index, item in enumerate(items) if item != items[0]]
    full_attention = [
        index for index in different if "attention" in str(items[index]) and "linear" not in str(items[index])
    ]
    picked = [0] + (full_attention or different)[:1]
    picked += [index for index in range(len(items)) if index not in picked][: NUM_LAYERS - len(picked)]
    return [items[index] for index in sorted(picked)]


def shrink_rope(rope, old_head_dim: int | None):
    """Rescale `mrope_section` (it splits the rotary half of a head) to HEAD_DIM; nested per-layer-type dicts too."""
    if not isinstance(rope, dict):
        return rope
    rope = {key: shrink_rope(value, old_head_dim) if isinstance(value, dict) else value for key, value in rope.items()}
    section = rope.get("mrope_section")
    if isinstance(section, list) and section and old_head_dim:
        total = max(len(section), round(sum(section) * HEAD_DIM / old_head_dim))
        rope["mrope_section"] = split_proportionally(section, total)
    return rope


def split_proportionally(parts: list[int], total: int) -> list[int]:
    """`total` split in the proportions of `parts`, each part >= 1 (largest remainders get the rest)."""
    shares = [part * (total - len(parts)) / sum(parts) for part in parts]
    result = [1 + math.floor(share) for share in shares]
    by_remainder = sorted(range(len(parts)), key=lambda i: (shares[i] - math.floor(shares[i]), -i), reverse=True)
    for index in by_remainder[: total - sum(result)]:
        result[index] += 1
    return result


class TokenIds:
    """Maps each distinct default token id to a small one: pad/bos/eos names first (0, 1, 2), others from 3 on."""

    def __init__(self):
        self.mapped: dict[int, int] = {}

    def map(self, name: str, value):
        if isinstance(value, list):
            return [self.map(name, item) for item in value]
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            return value
        if value not in self.mapped:
            taken = set(self.mapped.values())
            preferred = FIRST_TOKEN_IDS.index(name) if name in FIRST_TOKEN_IDS else None
            if preferred is not None and preferred not in taken:
                self.mapped[value] = preferred
            else:
                self.mapped[value] = next(i for i in range(len(FIRST_TOKEN_IDS), SPECIAL_IDS) if i not in taken)
        return self.mapped[value]


def set_path(fields: dict, path: str, value) -> None:
    *parents, name = path.split(".")
    for parent in parents:
        fields = fields[parent]
    fields[name] = value


def parameter_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters()) + sum(b.numel() for b in model.buffers())


def build_tiny_model(model_class: type, config: PretrainedConfig, budget: bool = True) -> torch.nn.Module:
    """`model_class(config)` in eval mode with seeded weights; with `budget`, TooLarge (counted on `meta`) before any
    allocation when it would exceed MAX_PARAMS (a real configuration is built without one)."""
    if budget:
        with torch.device("meta"):
            count = parameter_count(model_class(config))
        if count > MAX_PARAMS:
            raise TooLarge(f"{count:,} parameters and buffers > budget {MAX_PARAMS:,}")
    torch.manual_seed(0)
    return model_class(config).eval()
