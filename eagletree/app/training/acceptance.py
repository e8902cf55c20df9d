"""App: acceptance of a draft head measured through the real engine on given prompts.

Greedy (or sampled) continuations per tree shape (``measure_acceptance``); ``first_step_acceptance``
measures one step from many fresh contexts instead, which no looping continuation inflates, and
``lookup_acceptance`` the model-free prompt-lookup baseline. Each gives an ``AcceptanceRow``
(``acceptance_row``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from eagletree.app.composition.container import build_engine
from eagletree.app.training.acceptance_row import (
    AcceptanceRow,
    TreeShape,
)
from eagletree.app.training.prompt_lookup import LookupDrafter, simulate
from eagletree.config.settings import EngineSettings
from eagletree.domain.acceptance_stats import AcceptanceStats
from eagletree.domain.sampling import SamplingParams


def engine_settings(
    target: Path,
    draft: Path | None,
    algorithm: str,
    shape: TreeShape | None,
    device: str,
    max_context_len: int,
    backend: dict[str, str] | None = None,
    max_running_requests: int = 16,
    dtype: str | None = None,
    sampled_drafts: str = "auto",
) -> EngineSettings:
    """Settings of an engine for these measurements; on the CPU fp32 with the torch backends,
    else bf16 and the default (Triton) backends, ``backend`` overriding either;
    ``sampled_drafts``: ``speculative.sampled_drafts``."""
    on_cpu = device.startswith("cpu")
    speculative: dict[str, Any] = {"algorithm": "none"}
    if shape is not None:
        speculative = {
            "algorithm": algorithm,
            "num_steps": shape.num_steps,
            "eagle_topk": shape.topk,
            "num_draft_tokens": shape.num_draft_tokens,
            "sampled_drafts": sampled_drafts,
        }
    return EngineSettings(
        model={
            "target_path": str(target),
            "draft_path": None if draft is None else str(draft),
            "dtype": dtype or ("float32" if on_cpu else "bfloat16"),
            "device": device,
            "max_context_len": max_context_len,
        },
        speculative=speculative,
        memory={"max_total_tokens": 1 << 16, "max_running_requests": max_running_requests},
        backend={
            **({"attention": "torch", "kv_move": "torch"} if on_cpu else {}),
            **(backend or {}),
        },
    )


def plain_outputs(
    target: Path,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    device: str,
    backend: dict[str, str] | None = None,
    dtype: str | None = None,
) -> list[list[int]]:
    context = _context(prompts, max_new_tokens)
    settings = engine_settings(target, None, "none", None, device, context, backend, dtype=dtype)
    engine = build_engine(settings)
    return [r.output_ids for r in engine.generate(prompts, max_new_tokens=max_new_tokens)]


def _context(prompts: Sequence[Sequence[int]], max_new_tokens: int) -> int:
    return max(len(p) for p in prompts) + max_new_tokens + 1


def measure_acceptance(
    target: Path,
    draft: Path,
    algorithm: str,
    prompts: Sequence[Sequence[int]],
    shapes: Sequence[TreeShape],
    max_new_tokens: int,
    device: str,
    reference: Sequence[Sequence[int]] | None = None,
    backend: dict[str, str] | None = None,
    time_budget_s: float | None = None,
    temperature: float = 0.0,
    seed: int = 0,
    dtype: str | None = None,
    sampled_drafts: str = "auto",
) -> list[AcceptanceRow]:
    """One row per shape, in order; ``reference`` (plain greedy outputs) checks losslessness.
    With ``temperature`` > 0 request i samples with seed ``seed + i``. With ``time_budget_s``
    no shape starts after the budget is spent (fewer rows come back). ``sampled_drafts``: how
    sampling requests draft (``speculative.sampled_drafts``)."""
    rows = []
    budget_started = time.perf_counter()
    for shape in shapes:
        if time_budget_s is not None and time.perf_counter() - budget_started > time_budget_s:
            break
        context = _context(prompts, max_new_tokens)
        settings = engine_settings(
            target,
            draft,
            algorithm,
            shape,
            device,
            context,
            backend,
            dtype=dtype,
            sampled_drafts=sampled_drafts,
        )
        engine = build_engine(settings)
        started = time.perf_counter()
        results = engine.generate(
            prompts, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed
        )
        seconds = time.perf_counter() - started
        outputs = [r.output_ids for r in results]
        greedy_reference = reference if temperature == 0.0 else None
        matches = None
        if greedy_reference is not None:
            matches = outputs == [list(r) for r in greedy_reference]
        rows.append(
            AcceptanceRow.of(
                shape,
                [r.acceptance or AcceptanceStats(0, 0) for r in results],
                outputs,
                matches_plain=matches,
                seconds=seconds,
                temperature=temperature,
                reference=greedy_reference,
            )
        )
    return rows


def first_step_acceptance(
    target: Path,
    draft: Path,
    algorithm: str,
    contexts: Sequence[Sequence[int]],
    shape: TreeShape,
    device: str,
    backend: dict[str, str] | None = None,
    max_running_requests: int = 64,
) -> AcceptanceRow:
    """Greedy acceptance of the first verify step after each context's prefill: one step from
    many fresh contexts, which no looping continuation inflates. EOS does not stop a request
    here, so every first step is counted whole."""
    new_tokens = 1 + shape.num_steps + 1  # the prefill's token, then one full verify step
    settings = engine_settings(
        target,
        draft,
        algorithm,
        shape,
        device,
        _context(contexts, new_tokens),
        backend,
        max_running_requests,
    )
    engine = build_engine(settings)
    engine.eos_token_ids = frozenset()
    started = time.perf_counter()
    requests = [engine.submit(c, SamplingParams(max_new_tokens=new_tokens)) for c in contexts]
    while engine.has_work():
        engine.step()
    seconds = time.perf_counter() - started
    first = [AcceptanceStats.from_counts(r.emitted_per_step[:1]) for r in requests]
    return AcceptanceRow.of(
        shape, first, [[] for _ in requests], matches_plain=None, seconds=seconds
    )


def lookup_acceptance(
    num_steps: int,
    prompts: Sequence[Sequence[int]],
    reference: Sequence[Sequence[int]],
    max_ngram: int = 3,
) -> AcceptanceRow:
    """The prompt-lookup baseline drafting ``num_steps`` tokens per step, replayed exactly on
    the target's greedy continuations ``reference``."""
    drafter = LookupDrafter(num_steps, max_ngram=max_ngram)
    started = time.perf_counter()
    per_request = [
        AcceptanceStats.from_counts(simulate(drafter, prompt, output))
        for prompt, output in zip(prompts, reference, strict=True)
    ]
    return AcceptanceRow.of(
        TreeShape.chain(num_steps),
        per_request,
        reference,
        matches_plain=True,  # it only ever emits the target's own tokens
        seconds=time.perf_counter() - started,
    )
