"""The tokenizer and processor files of the tiny release (`devtools.tiny_release` writes the weights and
configs).

    tokenizer.json, tokenizer_config.json, chat_template.jinja   byte-level BPE with the Qwen3-Omni specials
    processor_config.json, preprocessor_config.json              Qwen vision processor + Whisper features

The values mirror the real Clef-omni release so that transformers' `AutoTokenizer` and
`Qwen3OmniMoeProcessor` load the tiny release exactly like the real one. Output is deterministic.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

CHAT_TEMPLATE = """{%- for message in messages -%}
<|im_start|>{{ message['role'] }}
{% if message['content'] is string -%}{{ message['content'] }}{%- else -%}
{%- for part in message['content'] -%}
{%- if part['type'] == 'image' -%}<|vision_start|><|image_pad|><|vision_end|>
{% elif part['type'] == 'audio' -%}<|audio_start|><|audio_pad|><|audio_end|>
{% elif part['type'] == 'video' -%}<|vision_start|><|video_pad|><|vision_end|>
{% else -%}{{ part['text'] }}{%- endif -%}
{%- endfor -%}{%- endif -%}<|im_end|>
{% endfor -%}
{%- if add_generation_prompt -%}<|im_start|>assistant
{% endif -%}
"""
"""Qwen-style ChatML: text parts as is, each media part as its start/pad/end token triple."""


def _dump(root: Path, name: str, obj: object) -> None:
    (root / name).write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def write_tokenizer_files(
    root: Path, tok: Any, ids: Mapping[str, int], special_tokens: Collection[str]
) -> None:
    """Write tokenizer.json, tokenizer_config.json and chat_template.jinja into `root`.

    `tok` is a built `tokenizers.Tokenizer`, `ids` every added token's id, `special_tokens` those added
    tokens that are special (skipped when decoding); the others are plain added tokens.
    """
    tok.save(str(root / "tokenizer.json"))
    decoder = {
        str(i): {
            "content": t,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "single_word": False,
            "special": t in special_tokens,
        }
        for t, i in sorted(ids.items(), key=lambda kv: kv[1])
    }
    _dump(
        root,
        "tokenizer_config.json",
        {
            "tokenizer_class": "Qwen2Tokenizer",
            "model_max_length": 65536,
            "errors": "replace",
            "add_prefix_space": False,
            "clean_up_tokenization_spaces": False,
            "split_special_tokens": False,
            "bos_token": None,
            "unk_token": None,
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "extra_special_tokens": {
                "image_token": "<|image_pad|>",
                "audio_token": "<|audio_pad|>",
                "video_token": "<|video_pad|>",
                "vision_bos_token": "<|vision_start|>",
                "vision_eos_token": "<|vision_end|>",
                "audio_bos_token": "<|audio_start|>",
                "audio_eos_token": "<|audio_end|>",
            },
            "added_tokens_decoder": decoder,
        },
    )
    (root / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")


def write_processor_files(root: Path) -> None:
    """Write processor_config.json and preprocessor_config.json (image, video and audio settings)."""
    image = {
        "image_processor_type": "Qwen2VLImageProcessor",
        "do_convert_rgb": True,
        "do_resize": True,
        "size": {"shortest_edge": 65536, "longest_edge": 1048576},
        "resample": 3,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "patch_size": 16,
        "temporal_patch_size": 2,
        "merge_size": 2,
    }
    # The video processor shares the image settings except the image processor type (removed, not null).
    video = {
        **image,
        "image_processor_type": None,
        "video_processor_type": "Qwen2VLVideoProcessor",
        "size": {"shortest_edge": 65536, "longest_edge": 262144},
        "fps": 2.0,
        "do_sample_frames": False,
    }
    del video["image_processor_type"]
    audio = {
        "feature_extractor_type": "WhisperFeatureExtractor",
        "feature_size": 128,
        "sampling_rate": 16000,
        "hop_length": 160,
        "chunk_length": 300,
        "n_fft": 400,
        "n_samples": 4800000,
        "nb_max_frames": 30000,
        "padding_side": "right",
        "padding_value": 0.0,
        "return_attention_mask": True,
        "dither": 0.0,
    }
    _dump(
        root,
        "processor_config.json",
        {
            "processor_class": "Qwen3OmniMoeProcessor",
            "image_processor": image,
            "video_processor": video,
            "feature_extractor": audio,
        },
    )
    _dump(root, "preprocessor_config.json", {**image, **audio, "processor_class": "Qwen3OmniMoeProcessor"})
