"""Write a tiny random-weight Clef-omni release in exactly the real layout (SPEC section 3).

`write_tiny_release(path, seed)` produces, deterministically from `seed` (same bytes for the same seed):
    config.json, generation_config.json            Qwen3OmniMoeConfig with thinker, talker, code2wav parts
    model-0000N-of-00004.safetensors + index       thinker.* (text MoE, vision, audio, lm_head), talker.*,
                                                   code2wav.*; shards 3 and 4 hold only talker/code2wav;
                                                   MoE experts one tensor per expert (`layout="per-expert"`,
                                                   the published layout) or fused per layer (`"fused"`)
    joint_head.safetensors + joint_head_config.json
    tokenizer.json, tokenizer_config.json, chat_template.jinja   byte-level BPE with the Qwen3-Omni specials
    processor_config.json, preprocessor_config.json              Qwen vision processor + Whisper features
(the tokenizer and processor files are written by `devtools.tiny_files`).
Tensor names are the checkpoint's under every transformers version: the thinker's as `engine.model.thinker.
checkpoint_names` gives them (`thinker.model.layers.N.*`, `thinker.visual.*`, `thinker.audio_tower.*`, ...),
the talker's and code2wav's as transformers' `Qwen3OmniMoeForConditionalGeneration` names them; the joint
head's are the SPEC section 4 names. Loads on a CPU in about a second. See docs/tiny-release.md for the
special token ids.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from safetensors.torch import save_file

from devtools.tiny_files import write_processor_files, write_tokenizer_files
from engine.model.head import JointHeadConfig, JointSchemaHead
from engine.model.release_plan import per_expert_sources
from engine.model.thinker import checkpoint_names

# fmt: off
SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
    "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<|audio_start|>", "<|audio_end|>", "<|audio_pad|>",
    "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>", "<tts_text_bos_single>",
)
"""Added tokens with special=True, in id order right after the BPE vocabulary."""
PLAIN_ADDED_TOKENS: tuple[str, ...] = (
    "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
)
"""Added tokens with special=False (matched in text, kept when decoding), after SPECIAL_TOKENS."""
# fmt: on

# Qwen-style pre-tokenisation: contractions, letter runs, single digits, punctuation runs, newlines, spaces.
_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_CORPUS = """\
Read the complete state and schema. Decide every field jointly. Each answer must be exactly one of
that field's allowed options. STATE: SCHEMA FIELDS: FIELD ID: TYPE: INSTRUCTION: ALLOWED OPTIONS: OPTION
END FIELD JOINT SCHEMA DECISIONS: system user assistant noul choice score true false department urgency
outage The proposition is true or the answer is yes. The proposition is false or the answer is no.
{"option_id":"network","description":"Routers, switches, links and DNS."} {"alert":"disk full","host":
"db-01","severity":3,"tags":["storage","prod"],"value":0.97,"ok":false,"owner":null}
[{"id":1,"name":"api"},{"id":2,"name":"edge"}] Which team owns this alert? How urgent is the fault?
Is there a customer-facing outage right now? database storage security billing platform edge api
The quick brown fox jumps over the lazy dog. Packets were dropped between two data centres at 03:14 UTC.
CPU usage 95% memory 12.5 GiB latency p99 850 ms error rate 4.2% region eu-west-1 us-east-2 0123456789
Überlastung des Speichers; café naïve résumé — “quotes” ‘single’ … ±×÷ 東京 データベース 서버 Ошибка сети
日本語のテキスト 中文字符 emoji 🚨🔥✅ αβγ δ λ Ω ∑ ≤ ≥ ≠ → ← ¿Dónde está el servidor? ça marche. Ελληνικά
"""


@dataclass(frozen=True, slots=True)
class TinyReleaseSpec:
    """Sizes of the tiny release (defaults: hidden 64, 2 MoE layers of 4 experts, top 2, head width 32)."""

    bpe_vocab_size: int = 900
    vocab_size: int = 1024
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    num_experts: int = 4
    top_k: int = 2
    head_width: int = 32
    head_routing_layers: int = 1
    head_layers: int = 2
    head_heads: int = 4
    head_feedforward: int = 64


def build_tokenizer(spec: TinyReleaseSpec) -> Any:
    """Train the byte-level BPE on the built-in corpus (deterministic) and add the Qwen3-Omni tokens."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.bpe_vocab_size,
        min_frequency=1,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([_CORPUS] * 4, trainer=trainer)
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    tok.add_tokens(list(PLAIN_ADDED_TOKENS))
    return tok


def token_ids(tok: Any) -> dict[str, int]:
    """Every added token's id in the built tokenizer."""
    return {t: int(tok.token_to_id(t)) for t in (*SPECIAL_TOKENS, *PLAIN_ADDED_TOKENS)}


# fmt: off
def _configs(spec: TinyReleaseSpec, ids: dict[str, int], first_id: Any) -> dict[str, Any]:
    """Keyword arguments of Qwen3OmniMoeConfig for the tiny release."""
    text = {
        "vocab_size": spec.vocab_size, "hidden_size": spec.hidden_size,
        "intermediate_size": 2 * spec.hidden_size,
        "num_hidden_layers": spec.num_layers, "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads, "head_dim": spec.hidden_size // spec.num_heads,
        "moe_intermediate_size": spec.hidden_size // 2, "num_experts": spec.num_experts,
        "num_experts_per_tok": spec.top_k, "norm_topk_prob": True, "max_position_embeddings": 65536,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [4, 2, 2],
                            "interleaved": True, "mrope_interleaved": True},
    }
    vision = {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "patch_size": 16,
              "spatial_merge_size": 2, "temporal_patch_size": 2, "out_hidden_size": spec.hidden_size,
              "num_position_embeddings": 2304, "deepstack_visual_indexes": [1]}
    audio = {"num_mel_bins": 128, "encoder_layers": 2, "encoder_attention_heads": 2, "encoder_ffn_dim": 64,
             "d_model": 32, "output_dim": spec.hidden_size, "downsample_hidden_size": 16}
    media_ids = {"audio_token_id": ids["<|audio_pad|>"], "image_token_id": ids["<|image_pad|>"],
                 "video_token_id": ids["<|video_pad|>"], "vision_start_token_id": ids["<|vision_start|>"],
                 "audio_start_token_id": ids["<|audio_start|>"]}
    thinker = {"text_config": text, "vision_config": vision, "audio_config": audio,
               "user_token_id": first_id("user"), "position_id_per_seconds": 13, **media_ids}
    talker = {
        "text_config": {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 32, "num_hidden_layers": 1,
                        "num_attention_heads": 2, "num_key_value_heads": 1, "moe_intermediate_size": 16,
                        "num_experts": 2, "num_experts_per_tok": 1, "shared_expert_intermediate_size": 32},
        "code_predictor_config": {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 32,
                                  "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
                                  "head_dim": 16, "num_code_groups": 4},
        "num_code_groups": 4, "thinker_hidden_size": spec.hidden_size, "spatial_merge_size": 2,
        "codec_eos_token_id": 60, "codec_nothink_id": 61, "codec_think_bos_id": 62, "codec_think_eos_id": 63,
        "codec_pad_id": 58, "codec_bos_id": 59, **media_ids,
    }
    code2wav = {"codebook_size": 64, "hidden_size": 32, "num_attention_heads": 2, "num_key_value_heads": 2,
                "intermediate_size": 32, "num_hidden_layers": 1, "num_quantizers": 4, "decoder_dim": 32,
                "upsample_rates": [2, 2, 2, 2], "upsampling_ratios": [2, 2]}
    return {"thinker_config": thinker, "talker_config": talker, "code2wav_config": code2wav,
            "enable_audio_output": True, "im_start_token_id": ids["<|im_start|>"],
            "im_end_token_id": ids["<|im_end|>"], "tts_pad_token_id": ids["<tts_pad>"],
            "tts_bos_token_id": ids["<tts_text_bos>"], "tts_eos_token_id": ids["<tts_text_eod>"],
            "system_token_id": first_id("system"), "user_token_id": first_id("user"),
            "assistant_token_id": first_id("assistant")}
# fmt: on


def _random_tensor(name: str, shape: torch.Size, gen: torch.Generator) -> torch.Tensor:
    """Deterministic values: norms near 1, biases near 0, embeddings wide, other weights std 0.02."""
    noise = torch.randn(shape, generator=gen, dtype=torch.float32)
    leaf = name.rsplit(".", 1)[-1]
    if len(shape) == 1 and leaf in ("weight", "gamma", "scale", "alpha", "beta") and "bias" not in name:
        return 1.0 + 0.02 * noise
    if leaf == "bias":
        return 0.02 * noise
    if name.endswith(("embed_tokens.weight", "lm_head.weight")):
        return 0.5 * noise
    return 0.02 * noise if "gate.weight" not in name else 0.5 * noise


Layout = Literal["per-expert", "fused"]
"""How MoE experts are stored (SPEC section 3): one tensor per expert (the published layout) or fused."""
LAYOUTS: tuple[Layout, ...] = ("per-expert", "fused")


def per_expert_tensors(name: str, tensor: torch.Tensor) -> dict[str, torch.Tensor] | None:
    """A fused expert tensor (`*.mlp.experts.gate_up_proj` [E, 2I, H] or `*.mlp.experts.down_proj`
    [E, H, I]) as the per-expert tensors of the published layout
    (`engine.model.release_plan.per_expert_sources`),
    or None for any other tensor."""
    sources = per_expert_sources(name, tuple(tensor.shape))
    if sources is None:
        return None
    flat = tensor.reshape(-1)
    return {s.name: flat[s.start : s.start + math.prod(s.shape)].view(s.shape).clone() for s in sources}


def _write_shards(root: Path, tensors: dict[str, torch.Tensor], layout: Layout) -> None:
    """Four shards, assigned on the fused names (so both layouts put every tensor in the same shard):
    thinker in 1 and 2, talker in 2 (mixed shard) and 3, code2wav in 4."""
    thinker_names = [n for n in tensors if n.startswith("thinker.")]
    other = [n for n in tensors if not n.startswith("thinker.")]
    half = len(thinker_names) // 2
    talker_names = [n for n in other if n.startswith("talker.")]
    shards = [
        thinker_names[:half],
        thinker_names[half:] + talker_names[:4],  # mixed shard: thinker and talker bytes side by side
        talker_names[4:],
        [n for n in other if n.startswith("code2wav.")],
    ]
    weight_map: dict[str, str] = {}
    for i, shard_names in enumerate(shards, start=1):
        file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        stored: dict[str, torch.Tensor] = {}
        for n in shard_names:
            split = per_expert_tensors(n, tensors[n]) if layout == "per-expert" else None
            stored.update(split if split is not None else {n: tensors[n]})
        save_file(stored, str(root / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(stored, file))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (root / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")


def release_shapes(config: Any) -> dict[str, torch.Size]:
    """Release tensor name -> shape for a `Qwen3OmniMoeConfig`: every tensor of the full model (thinker,
    talker, code2wav), thinker names mapped to the checkpoint's. Built on the meta device (no memory)."""
    from transformers import Qwen3OmniMoeForConditionalGeneration

    with torch.device("meta"):
        full = Qwen3OmniMoeForConditionalGeneration(config)
    thinker_names = checkpoint_names(full.thinker)
    shapes: dict[str, torch.Size] = {}
    for key, value in full.state_dict().items():
        inner = key.removeprefix("thinker.")
        shapes[thinker_names[inner] if inner != key else key] = value.shape
    return shapes


def write_tiny_release(
    path: str | Path, seed: int = 0, spec: TinyReleaseSpec | None = None, layout: Layout = "per-expert"
) -> Path:
    """Write the tiny release into `path` (created if needed; existing files overwritten) and return it.

    `layout` stores the MoE experts one tensor per expert (default, as published) or fused; the values are
    the same either way."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    from transformers import Qwen3OmniMoeConfig

    spec = spec or TinyReleaseSpec()
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(spec)
    ids = token_ids(tok)
    if max(ids.values()) >= spec.vocab_size:
        raise ValueError(f"tokenizer needs {max(ids.values()) + 1} ids, vocab_size is {spec.vocab_size}")

    def first_id(word: str) -> int:
        return int(tok.encode(word, add_special_tokens=False).ids[0])

    config = Qwen3OmniMoeConfig(**_configs(spec, ids, first_id))
    config.architectures = ["Qwen3OmniMoeForConditionalGeneration"]
    config.dtype = torch.bfloat16
    config.save_pretrained(str(root))
    generation = {
        "bos_token_id": ids["<|im_start|>"],
        "pad_token_id": ids["<|endoftext|>"],
        "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
        "do_sample": False,
    }
    (root / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n", encoding="utf-8")

    shapes = release_shapes(config)
    gen = torch.Generator().manual_seed(seed)
    tensors = {n: _random_tensor(n, s, gen).to(torch.bfloat16) for n, s in sorted(shapes.items())}
    _write_shards(root, tensors, layout)

    head_config = JointHeadConfig(
        hidden_size=spec.hidden_size,
        width=spec.head_width,
        routing_layers=spec.head_routing_layers,
        layers=spec.head_layers,
        heads=spec.head_heads,
        feedforward=spec.head_feedforward,
    )
    with torch.random.fork_rng(devices=[]):  # nn.Module init draws from the global generator
        torch.manual_seed(seed)
        head = JointSchemaHead(head_config)
        for _name, param in head.named_parameters():
            if param.ndim == 0:  # scales and gate: ln 10, ln 10, 0 plus noise so tests see every term
                param.data.add_(0.1 * torch.randn((), dtype=param.dtype))
    head_state = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in head.state_dict().items()}
    save_file(head_state, str(root / "joint_head.safetensors"), metadata={"format": "pt"})
    (root / "joint_head_config.json").write_text(head_config.to_json() + "\n", encoding="utf-8")

    write_tokenizer_files(root, tok, ids, SPECIAL_TOKENS)
    write_processor_files(root)
    return root
