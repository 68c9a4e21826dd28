"""Full-size Clef-omni thinker built with random bf16 weights directly on the GPU (benchmarks only).

The shapes are those of Qwen3-Omni-30B-A3B's thinker (48 layers, 128 experts, top 8, hidden 2048;
vision and audio towers as released). Weight values do not change speed, so random weights give the
same timings as the real release. Router weights are random too, so tokens spread over experts as in a
trained model rather than all picking the same eight.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

TEXT_CONFIG: dict[str, Any] = {
    "hidden_size": 2048,
    "intermediate_size": 768,
    "moe_intermediate_size": 768,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "norm_topk_prob": True,
    "vocab_size": 152064,
    "max_position_embeddings": 65536,
    "rms_norm_eps": 1e-6,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 1000000.0,
        "mrope_section": [24, 20, 20],
        "mrope_interleaved": True,
    },
}


def text_config(num_layers: int | None = None) -> Any:
    """A `Qwen3OmniMoeTextConfig` at full size (optionally with fewer layers for quick probes)."""
    from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeTextConfig

    kw = dict(TEXT_CONFIG)
    if num_layers is not None:
        kw["num_hidden_layers"] = num_layers
    return Qwen3OmniMoeTextConfig(**kw)


@torch.no_grad()
def randomize_(module: nn.Module, std: float = 0.02, seed: int = 0) -> None:
    """Fill every matrix with N(0, std) and every norm weight with ones, in place, on its device."""
    gen = torch.Generator(device=next(module.parameters()).device).manual_seed(seed)
    for name, p in module.named_parameters():
        if p.ndim >= 2:
            p.normal_(0.0, std, generator=gen)
        elif name.endswith("weight"):
            p.fill_(1.0)
        else:
            p.zero_()


def build_text_model(num_layers: int | None = None, attn: str = "sdpa", experts: str = "grouped_mm") -> Any:
    """The full-size thinker text model (embeddings + decoder, no lm_head) in bf16 on CUDA."""
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeThinkerTextModel

    cfg = text_config(num_layers)
    cfg._attn_implementation = attn
    cfg._experts_implementation = experts
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            model = Qwen3OmniMoeThinkerTextModel(cfg)
    finally:
        torch.set_default_dtype(old)
    randomize_(model)
    model.train(False)
    return model
