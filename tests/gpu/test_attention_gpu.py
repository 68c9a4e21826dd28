"""GPU: the packed causal attention kernel (`engine.kernels.attention`) against torch's varlen
FlashAttention 2, which the fast path ran before, and its batch invariance (a record's output is the
same bits alone and inside any pack)."""

from __future__ import annotations

import pytest
import torch

from engine.kernels import attention

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

HQ, HK, D = 32, 4, 128


def _qkv(t: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(t, h, D, device="cuda", generator=gen).bfloat16() for h in (HQ, HK, HK))
    return q, k, v


def _cu(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *lengths], device="cuda").cumsum(0).to(torch.int32)


@pytest.mark.parametrize("lengths", [[807], [512] * 64, [1, 63, 64, 65, 700, 0, 129], [3000, 17]])
def test_packed_attention_matches_varlen_flash_attention_cuda(lengths: list[int]) -> None:
    from torch.nn.attention.varlen import varlen_attn

    q, k, v = _qkv(sum(lengths), seed=len(lengths))
    cu, longest = _cu(lengths), max(lengths)
    want = varlen_attn(q, k, v, cu, cu, longest, longest, window_size=(-1, 0))
    assert isinstance(want, torch.Tensor)
    got = attention.attention(q, k, v, cu, longest)
    err = float((got.float() - want.float()).abs().max())
    scale = float(want.float().abs().max())
    print(
        f"packed attention vs varlen, {len(lengths)} records: max |diff| = {err:.2e} (max |out| {scale:.2f})"
    )
    assert err <= 2e-2


def test_packed_attention_of_a_record_is_the_same_alone_and_in_a_pack_cuda() -> None:
    lengths = [300, 807, 45, 512]
    q, k, v = _qkv(sum(lengths), seed=7)
    packed = attention.attention(q, k, v, _cu(lengths), max(lengths))
    start = 0
    for n in lengths:
        rows = slice(start, start + n)
        alone = attention.attention(q[rows], k[rows], v[rows], _cu([n]), n)
        assert torch.equal(alone, packed[rows]), f"record of {n} tokens differs alone"
        start += n
    # A larger max_seqlen (a graph's cap) only adds programs that return at once.
    assert torch.equal(attention.attention(q, k, v, _cu(lengths), 4096), packed)
