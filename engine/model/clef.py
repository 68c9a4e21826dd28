"""`ClefOmniModel`: the Qwen3-Omni thinker's text decoder plus the joint schema head.

The head reads the thinker's final normalised hidden states (the text model's output, after its last RMSNorm);
the thinker's `lm_head` is never applied, its weight rows are the head's lexical table E.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from engine.batching.collate import Layout, ModelBatch, collate
from engine.device import configure_cublaslt
from engine.kernels import moe_fp8_sm90
from engine.model.decoder import PackedTextDecoder, varlen_available
from engine.model.graphs import GraphedDecoder
from engine.model.head import JointSchemaHead
from engine.model.media import media_hidden_states, rope_positions
from engine.model.packed_ids import PackedIds, packed_inputs
from engine.model.thinker import part_paths
from engine.types import Between, EncodedRequest

_VARLEN_ATTENTION = ("flash_attention_2", "flash_attention_3", "flex_attention")

log = logging.getLogger(__name__)


class HostCopy:
    """The batch's one device-to-host copy of `values`, queued at construction; `wait()` returns the float32
    host array once it landed (any thread, the GIL released while waiting).

    On CUDA: a non-blocking copy into pinned memory on the current stream and an event recorded after it,
    instead of a copy into pageable memory, which waits inside the driver until the stream has run the
    whole batch and meanwhile holds the prepare thread's host-to-device copy of the next batch
    (`ModelBatch.to`): on one H100 that copy took 9.11 ms on average beside the pageable copy and 0.92 ms
    beside this one (`bench.stage_probe`; `bench.copy_probe`: p50 0.806 against 0.046 ms), and the p99 at
    70% load fell from 205-214 to 188 ms (BENCHMARKS.md, "Priority classes, round nine").
    """

    def __init__(self, values: torch.Tensor) -> None:
        self._event: torch.cuda.Event | None = None
        if values.device.type != "cuda":
            self._host = values.to("cpu", torch.float32)
            return
        self._host = torch.empty(values.shape, dtype=torch.float32, pin_memory=True)
        self._host.copy_(values.float(), non_blocking=True)
        self._event = torch.cuda.Event(blocking=True)  # type: ignore[no-untyped-call]
        self._event.record()

    def wait(self) -> npt.NDArray[np.float32]:
        if self._event is not None:
            self._event.synchronize()
        return self._host.numpy()


def to_host(values: torch.Tensor) -> npt.NDArray[np.float32]:
    """`values` as a float32 host array (blocking): `HostCopy(values).wait()`."""
    return HostCopy(values).wait()


class _LaunchedRecords:
    """`ClefOmniModel.launch_batch`'s result: a `engine.types.Launched` of the probabilities per record, per
    question, per option, cut from the flat host copy once it landed."""

    def __init__(self, copy: HostCopy, options_per_question: Sequence[Sequence[int]]) -> None:
        self._copy = copy
        self._options = options_per_question

    def wait(self) -> tuple[list[list[npt.NDArray[np.float32]]], float | None]:
        flat = self._copy.wait()  # (N,)
        out: list[list[npt.NDArray[np.float32]]] = []
        offset = 0
        for counts in self._options:
            record: list[npt.NDArray[np.float32]] = []
            for n in counts:
                record.append(flat[offset : offset + n])
                offset += n
            out.append(record)
        return out, None


_HEAD_SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
"""Every SDPA backend but cuDNN's, for the head off CUDA (see `ClefOmniModel.forward_probabilities`)."""
_HEAD_SDPA_BACKENDS_CUDA = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
"""The head's SDPA backends on CUDA: the memory-efficient kernel (math only for shapes it refuses)."""


class ClefOmniModel(nn.Module):
    """Thinker (transformers' `Qwen3OmniMoeThinkerForConditionalGeneration`) + `JointSchemaHead`."""

    def __init__(self, thinker: nn.Module, head: JointSchemaHead, pad_token_id: int = 0) -> None:
        super().__init__()
        configure_cublaslt()  # before the first GEMM of the process (`engine.device`)
        self.thinker = thinker
        self.head = head
        self.pad_token_id = pad_token_id
        # Where the text decoder sits depends on the transformers version; found once from the module tree.
        self._text_path = part_paths(thinker)["model"]
        self._fast: PackedTextDecoder | None = None
        self._graphed: GraphedDecoder | None = None
        self._text_only = False  # set once the fast path has freed the bf16 experts

    def enable_fast_path(
        self,
        *,
        graph_buckets: tuple[int, ...] = (),
        max_graph_records: int = 16,
        fp8_experts: bool = False,
        fused_experts: bool = True,
        triton_attention: bool = True,
        text_only: bool = False,
        fp8_attention: bool = False,
        sm90_experts: moe_fp8_sm90.Extension | None = None,
    ) -> bool:
        """Use the padding-free varlen decoder (`engine.model.decoder`) for text-only batches on CUDA.

        Optional CUDA graphs (`engine.model.graphs`) replay the decoder for batches up to the largest of
        `graph_buckets` tokens (single requests and small batches, where kernel launches dominate).
        `fp8_experts` runs the MoE experts in FP8 (`engine.kernels.fp8`, opt-in; the release is bf16);
        with `text_only` too, the bf16 experts are freed for good (`PackedTextDecoder.use_fp8_experts`):
        about half the memory, and from then on a batch with media raises ValueError (`text_only`).
        `fp8_attention` runs the attention projections (fused QKV, output) in FP8 as well
        (`PackedTextDecoder.use_fp8_attention`; opt-in, apart from the experts; the media path stays bf16).
        `sm90_experts` (`EngineConfig.sm90_experts`, benches) runs the FP8 experts of the calls
        `moe_fp8_sm90.takes` accepts through that built `engine.kernels.moe_fp8_sm90` extension's CUDA cluster
        kernels, the down GEMM of those `takes_down` accepts, the rest through Triton (None: all).
        `fused_experts=False` runs bf16 experts unfused (CUTLASS grouped GEMMs instead of
        `engine.kernels.moe`), `triton_attention=False` runs attention through torch's varlen
        FlashAttention 2 instead of `engine.kernels.attention`. Calling again switches any of them and
        recaptures the graphs. Blocking (graph capture: a few hundred ms per graph at full size). Returns
        False (and changes nothing) off CUDA or when this torch lacks varlen attention / grouped GEMMs.
        """
        if self.device.type != "cuda" or not varlen_available():
            return False
        start = time.monotonic()
        if self._fast is None:  # built once: it holds fused QKV copies of the attention weights
            self._fast = PackedTextDecoder(self.text_model)
        self._fast.use_fp8_experts(fp8_experts, text_only=fp8_experts and text_only)
        self._text_only = self._fast.text_only
        self._fast.use_fp8_attention(fp8_attention)
        self._fast.fused_experts = fused_experts
        self._fast.triton_attention = triton_attention
        self._fast.sm90_experts = sm90_experts
        built = time.monotonic()
        self._graphed = (
            GraphedDecoder(self._fast, graph_buckets, max_graph_records) if graph_buckets else None
        )
        graphs = 0
        if self._graphed is not None:
            graphs = self._graphed.capture_all(self.device)
        log.info(
            "fast path built in %.2fs (fp8 experts %s, fp8 attention %s); %d CUDA graphs captured and "
            "replayed in %.2fs",
            built - start,
            fp8_experts,
            fp8_attention,
            graphs,
            time.monotonic() - built,
        )
        return True

    @property
    def text_model(self) -> Any:
        """The thinker's text decoder (`embed_tokens`, `layers`, `norm`, `rotary_emb`), at the module path
        `engine.model.thinker.part_paths` found once: `thinker.model` under transformers 5.17,
        `thinker.model.language_model` under 5.24."""
        return self.thinker.get_submodule(self._text_path)

    @property
    def fast_path(self) -> bool:
        return self._fast is not None

    @property
    def text_only(self) -> bool:
        """The bf16 experts were freed (FP8 text-only, `enable_fast_path`): only text batches can run."""
        return self._text_only

    @property
    def device(self) -> torch.device:
        return next(self.head.parameters()).device

    @property
    def _thinker_config(self) -> Any:
        """The thinker's transformers config (`Qwen3OmniMoeThinkerConfig`)."""
        config: Any = self.thinker.config
        return config

    @property
    def attn_implementation(self) -> str:
        """The thinker's attention implementation (`sdpa` while transformers has not resolved one)."""
        return str(self._thinker_config._attn_implementation or "sdpa")

    @property
    def preferred_layout(self) -> Layout:
        """`packed` unless attention is dense sdpa/eager on a GPU, where a block-diagonal (T, T) mask would
        cost quadratic work over the whole pack; there right-padding to the batch's longest record wins."""
        dense = self.attn_implementation not in _VARLEN_ATTENTION
        if self._fast is None and self.device.type == "cuda" and dense:
            return "padded"
        return "packed"

    @property
    def media_layout(self) -> Layout:
        """Layout for batches with media, which always take the transformers path: `padded` for dense
        attention on a GPU (as `preferred_layout` without the fast path), else `packed`."""
        dense = self.attn_implementation not in _VARLEN_ATTENTION
        return "padded" if self.device.type == "cuda" and dense else "packed"

    def can_pack(self, with_media: bool) -> bool:
        """Whether records packed back to back in one row need no dense attention mask: text on the varlen
        fast path, or any batch under a varlen attention implementation. Otherwise transformers turns
        the packed row into a block-diagonal (T, T) mask, quadratic in the pack's tokens."""
        varlen = self.attn_implementation in _VARLEN_ATTENTION
        return varlen or (not with_media and self._fast is not None)

    def layout_for(self, with_media: bool) -> Layout:
        """The layout `collate` picks when given none: `media_layout` for a batch with media records,
        else `preferred_layout`."""
        return self.media_layout if with_media else self.preferred_layout

    def rope_index(self, record: EncodedRequest) -> torch.Tensor:
        """(3, L) int64 t/h/w rope positions of a media record (CPU; `engine.model.media.rope_positions`)."""
        return rope_positions(self.thinker, record)

    def collate(self, encoded: Sequence[EncodedRequest], layout: Layout | None = None) -> ModelBatch:
        """`engine.batching.collate.collate` with this model's layout, pad id, device and media rope index."""
        with_media = any(rec.media for rec in encoded)
        return collate(
            encoded,
            layout=layout or self.layout_for(with_media),
            pad_token_id=self.pad_token_id,
            device=self.device,
            rope_index=self.rope_index if with_media else None,
            n_window=int(self._thinker_config.audio_config.n_window),
        )

    def hidden_states(self, batch: ModelBatch, between: Between | None = None) -> torch.Tensor:
        """(T, hidden) final normalised states of the batch's real tokens, records back to back. `between`
        is called between decoder layers on the text fast path's eager forward (never in a graph)."""
        text_model = self.text_model
        hidden: torch.Tensor
        if batch.media is not None:  # media never takes the text-only fast path
            if self.text_only:
                raise ValueError("media cannot run: the bf16 experts were freed (FP8 text-only mode)")
            hidden = media_hidden_states(self.thinker, text_model, batch)  # (rows, cols, H)
        elif self._fast is not None and batch.layout == "packed":
            return self._fast_hidden_states(text_model, batch, between)
        else:
            out = text_model(
                input_ids=batch.input_ids,
                position_ids=batch.position_ids,
                attention_mask=batch.attention_mask,
                use_cache=False,
            )
            hidden = out.last_hidden_state  # (rows, cols, H)
        flat = hidden.reshape(-1, hidden.shape[-1])  # (rows * cols, H)
        return flat if batch.token_gather is None else flat[batch.token_gather]  # (T, H)

    def _fast_hidden_states(
        self, text_model: Any, batch: ModelBatch, between: Between | None = None
    ) -> torch.Tensor:
        assert self._fast is not None
        if batch.media is not None:
            raise ValueError("a batch with media cannot take the text-only fast path")
        # (T,) ids, (3, T) t/h/w rope positions; the record offsets are built from the host's lengths
        packed = PackedIds(batch.input_ids[0], batch.position_ids[1:, 0, :], batch.lengths)
        if self._graphed is not None:
            return self._graphed.run(packed, between)
        return self._fast(packed_inputs(text_model.embed_tokens, packed), between)

    def queues_whole(self, batch: ModelBatch) -> bool:
        """True when `launch_batch(batch)` queues its device work without an eager decoder layer: a text
        batch on the fast path that CUDA graphs replay (`GraphedDecoder.covers`). Everything else (eager
        layers paced to the device, media, transformers' path) runs step by step with the device."""
        graphed = self._graphed
        return (
            graphed is not None
            and batch.media is None
            and batch.layout == "packed"
            and graphed.covers(batch.lengths)
        )

    def lexical_table(self) -> torch.Tensor:
        lm_head: Any = self.thinker.lm_head
        weight: torch.Tensor = lm_head.weight  # (V, H)
        return weight

    def forward_probabilities(self, batch: ModelBatch, between: Between | None = None) -> torch.Tensor:
        """Flat (N,) float32 option probabilities on the model's device (see `SpanIndex` for the order).

        The head's attention never takes cuDNN's SDPA: cuDNN builds a plan for every new (records,
        longest) shape, and under load nearly every small batch has a new shape; the other backends need no
        plan (`bench.cold_probe`; BENCHMARKS.md, "Latency under load"). Transformers' padded path (media)
        keeps the default choice, which holds its batches within the SPEC's 2e-3 of the same records alone
        (tests/gpu/test_media_gpu.py).

        On CUDA the head takes the memory-efficient kernel only: a padded batch's attentions are masked,
        and FlashAttention, which SDPA prefers when there is no mask (a lone record, records of one
        length), would give those records other roundings than the same records in a padded batch (its
        cost: BENCHMARKS.md, "Engine, round five"). Off CUDA (CPU tests, the float32 conformance run)
        torch's choice stands.
        """
        hidden = self.hidden_states(batch, between)  # (T, H)
        cuda = hidden.device.type == "cuda"
        with sdpa_kernel(_HEAD_SDPA_BACKENDS_CUDA if cuda else _HEAD_SDPA_BACKENDS):
            probs: torch.Tensor = self.head(hidden, self.lexical_table(), batch.index)  # (N,)
        return probs

    def forward_batch(
        self, batch: ModelBatch, between: Between | None = None
    ) -> list[list[npt.NDArray[np.float32]]]:
        """Probabilities per record, per question (request order), per option (`option_table` order);
        `between` as in `hidden_states`. Blocking: `launch_batch(batch, between).wait()[0]`.

        `batch` must already be on the model's device (see `collate`). One device-to-host copy per batch.
        May raise `torch.OutOfMemoryError` (the caller splits the batch).
        """
        return self.launch_batch(batch, between).wait()[0]

    def launch_batch(self, batch: ModelBatch, between: Between | None = None) -> _LaunchedRecords:
        """`forward_batch` with its device work queued only (under `torch.inference_mode()`): `wait()` on the
        result (any thread) gives what `forward_batch` returns once the device ran it. The returned value
        keeps the copy's host memory; nothing else of the batch must outlive the call."""
        with torch.inference_mode():
            copy = HostCopy(self.forward_probabilities(batch, between))  # (N,)
        return _LaunchedRecords(copy, batch.options_per_question)
