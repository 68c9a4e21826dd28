"""Workload for `bench.engine`: the full-size engine built on the GPU, and realistic SystemOne requests.

`build_engine` makes the full-size thinker (text MoE, vision and audio towers) and the joint head with random
bf16 weights directly on CUDA, with the tiny release's tokenizer (the real one cannot be downloaded here).
`make_request` builds 3-question requests (choice with 4-8 options, score with 4 levels, noul) whose encoding
comes close to a target token count.
"""

from __future__ import annotations

import json
import random
import tempfile
from pathlib import Path

import torch

from bench.fullsize import TEXT_CONFIG, randomize_
from bench.routing import Routing, level, probe_batch, router_biases
from engine.runner import Engine, EngineConfig
from schemas.systemone import SystemOneRequest, parse_request

WORDS = (
    "disk",
    "latency",
    "router",
    "packet",
    "loss",
    "on",
    "rack",
    "b7",
    "after",
    "deploy",
    "of",
    "the",
    "payment",
    "service",
    "timeouts",
    "spiked",
    "database",
    "replica",
    "lag",
    "grew",
    "to",
    "minutes",
    "badge",
    "reader",
    "offline",
    "ssl",
    "certificate",
    "expired",
    "users",
    "report",
    "errors",
    "503",
    "cooling",
    "unit",
    "alarm",
    "temperature",
    "rising",
    "in",
    "hall",
    "c",
    "firewall",
    "blocked",
)
DEPARTMENTS = (
    "network",
    "database",
    "storage",
    "security",
    "application",
    "facilities",
    "identity",
    "billing",
)


def build_engine(
    config: EngineConfig,
    num_layers: int | None = None,
    tune_process: bool = True,
    routing: Routing = "levelled",
) -> Engine:
    """Full-size thinker + joint head, random bf16 weights on CUDA, tiny-release tokenizer.

    `routing` "levelled" (the default) biases every router to near-uniform expert load, the way a trained
    router spreads tokens (`bench.routing`); "random" leaves the random routers as built.

    `num_layers` (None: the full 48) builds fewer decoder layers, every other shape unchanged, for quick
    probes of the code path; figures from such a build are not full-size figures. With `tune_process`
    the process's garbage collector is then tuned as the service tunes it at start-up
    (`consumer.runtime.tune_gc` with the settings' defaults): without it, a full collection of the
    ~500,000 objects start-up leaves alive stalled one 131,072-token stream for 346.3 ms
    (`bench.stream_probe`, BENCHMARKS.md)."""
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeThinkerConfig

    from devtools.tiny_release import write_tiny_release
    from engine.model.clef import ClefOmniModel
    from engine.model.head import JointHeadConfig, JointSchemaHead
    from engine.model.thinker import allocate_parameters, build_thinker

    tiny = write_tiny_release(Path(tempfile.mkdtemp(prefix="clef-bench-")) / "tiny")
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(tiny))
    tiny_cfg = json.loads((tiny / "config.json").read_text())["thinker_config"]
    media_ids = {
        k: tiny_cfg[k]
        for k in (
            "audio_token_id",
            "image_token_id",
            "video_token_id",
            "vision_start_token_id",
            "audio_start_token_id",
        )
    }
    thinker_config = Qwen3OmniMoeThinkerConfig(
        text_config={**TEXT_CONFIG, **({} if num_layers is None else {"num_hidden_layers": num_layers})},
        vision_config={"out_hidden_size": TEXT_CONFIG["hidden_size"]},
        audio_config={"output_dim": TEXT_CONFIG["hidden_size"]},
        **media_ids,
    )
    thinker = build_thinker(thinker_config, "cuda", torch.bfloat16, "sdpa")
    allocate_parameters(thinker, "cuda")
    randomize_(thinker)
    with torch.device("cuda"):
        head = JointSchemaHead(JointHeadConfig(hidden_size=TEXT_CONFIG["hidden_size"])).to(torch.bfloat16)
    randomize_(head, seed=1)
    model = ClefOmniModel(thinker, head, pad_token_id=int(tokenizer.pad_token_id or 0)).eval()
    biases = router_biases(model) if routing == "levelled" else []  # before any graph capture
    engine = Engine(model, tokenizer, config)
    if biases:
        level(engine, biases, probe_batch(engine))
    if tune_process:
        from consumer.runtime import tune_gc
        from consumer.settings import Settings

        fields = Settings.model_fields
        tune_gc(int(fields["gc_gen0_threshold"].default), freeze=bool(fields["gc_freeze"].default))
    return engine


def make_request(rng: random.Random, engine: Engine, target_tokens: int) -> SystemOneRequest:
    """A 3-question SystemOne request whose encoding is close to `target_tokens` tokens."""
    n_opts = rng.randint(4, 8)
    questions = {
        "department": {
            "type": "choice",
            "instructions": "Owning team?",
            "criteria": {d: None for d in DEPARTMENTS[:n_opts]},
        },
        "urgency": {
            "type": "score",
            "instructions": "Urgency?",
            "criteria": ["low", "medium", "high", "critical"],
        },
        "outage": {"type": "noul", "instructions": "Outage?"},
    }
    words = max(1, target_tokens // 2)
    request = parse_request({"state": "", "questions": questions})
    for _ in range(4):  # proportional correction converges in a few steps
        text = " ".join(rng.choice(WORDS) for _ in range(words))
        request = parse_request(
            {
                "state": {"alert": "incident", "message": text, "host": f"h{rng.randint(1, 99)}"},
                "questions": questions,
            }
        )
        have = engine.prepare(request).num_tokens
        if abs(have - target_tokens) <= max(4, target_tokens // 100):
            break
        overhead = engine.prepare(parse_request({"state": "", "questions": questions})).num_tokens
        words = max(1, round(words * (target_tokens - overhead) / max(1, have - overhead)))
    return request
