"""Composition: the checks and steps around the container's providers at engine start-up.

Settings checks that need no checkpoint, the checks that need the loaded target, the
CUDA-graph decision and capture, and the engine's assembly. Nothing here names an adapter;
``app/composition/`` calls these functions from its providers.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import TYPE_CHECKING

from eagletree.app.engine.loop import Engine
from eagletree.app.workers.step_graphs import graph_buckets
from eagletree.config.cuda_graphs import ResolvedCudaGraphs, resolve_cuda_graphs
from eagletree.config.overlap import resolve_overlap
from eagletree.config.shape_policy import ResolvedShapePolicy, resolve_shape_policy
from eagletree.domain.draft_shape import DraftShape
from eagletree.domain.errors import ConfigurationError

if TYPE_CHECKING:
    from eagletree.app.engine.phases import PhaseAgreement
    from eagletree.app.engine.scheduler import PrefillStep
    from eagletree.app.engine.worker import Worker
    from eagletree.config.eagle_hook import ResolvedSpeculative, WorkerName
    from eagletree.config.settings import EngineSettings
    from eagletree.config.target import TargetDescription
    from eagletree.ports.memory import ReqToTokenPool, TokenSlotAllocator
    from eagletree.ports.tokenizer import Tokenizer

_log = logging.getLogger("eagletree.engine")


def check_engine_settings(settings: EngineSettings) -> None:
    """What an engine needs before anything is loaded: a target directory, and a combination
    the dense layers' sharding supports (the parallel sizes are checked against the process
    group when the container builds the groups)."""
    target_path = settings.model.target_path
    if target_path is None:
        raise ConfigurationError(
            "model.target_path is unset: set it to a checkpoint directory (config.json + "
            "safetensors), e.g. one written by `eagletree init-random`"
        )
    if not Path(target_path).is_dir():
        raise ConfigurationError(
            f"model.target_path = {target_path!r} is not a directory: point it at a checkpoint "
            "(config.json + safetensors), e.g. one written by `eagletree init-random`"
        )
    check_dense_sharding(settings)


def shards_dense_over_dp(settings: EngineSettings) -> bool:
    """Whether the dense layers are sharded over the data-parallel ranks."""
    return settings.parallel.shard_dense_over_dp and settings.parallel.dp_size > 1


def check_dense_sharding(settings: EngineSettings) -> None:
    """``parallel.shard_dense_over_dp`` runs with tp_size 1: a rank's attention is whole."""
    if not shards_dense_over_dp(settings):
        return
    if settings.parallel.tp_size > 1:
        raise ConfigurationError(
            f"parallel.shard_dense_over_dp with parallel.tp_size = {settings.parallel.tp_size}: "
            "the dense layers are sharded over the data-parallel ranks only with tp_size 1; "
            "set parallel.tp_size = 1 or parallel.shard_dense_over_dp = false"
        )


def check_context_len(settings: EngineSettings, target: TargetDescription) -> None:
    """model.max_context_len past the target's position limit is an error, not extrapolation."""
    asked = settings.model.max_context_len
    if asked is not None and asked > target.max_position_embeddings:
        raise ConfigurationError(
            f"model.max_context_len = {asked} exceeds the target's max_position_embeddings "
            f"({target.max_position_embeddings}): lower it or leave it unset"
        )


def check_topk(resolved: ResolvedSpeculative, vocab_size: int) -> None:
    """A draft step cannot pick more distinct tokens than the vocabulary has."""
    if resolved.enabled and resolved.topk > vocab_size:
        raise ConfigurationError(
            f"speculative.eagle_topk = {resolved.topk} exceeds the target vocabulary "
            f"({vocab_size} tokens): lower speculative.eagle_topk"
        )


def check_draft_topk(resolved: ResolvedSpeculative, draft_vocab_sizes: Collection[int]) -> None:
    """A draft step cannot pick more distinct tokens than its draft proposes from (an EAGLE-3
    draft vocabulary, a token map)."""
    for size in draft_vocab_sizes:
        if resolved.topk > size:
            source = "speculative.token_map" if resolved.token_map else "its draft vocabulary"
            raise ConfigurationError(
                f"speculative.eagle_topk = {resolved.topk} exceeds the {size} tokens the draft "
                f"proposes from ({source}): lower speculative.eagle_topk"
            )


def cuda_graph_decision(
    settings: EngineSettings, device_type: str, worker: WorkerName
) -> ResolvedCudaGraphs:
    """``resolve_cuda_graphs``, logging why the decode steps run eagerly when they do."""
    resolved = resolve_cuda_graphs(settings, device_type, worker)
    if resolved.reason is not None:
        _log.info("decode steps run eagerly: %s", resolved.reason)
    return resolved


def overlap_decision(settings: EngineSettings, device_type: str, worker: WorkerName) -> bool:
    """``resolve_overlap``, logging why the engine runs synchronously when it does."""
    resolved = resolve_overlap(settings, device_type, worker)
    if resolved.reason is not None:
        _log.info("the engine runs synchronously: %s", resolved.reason)
    return resolved.enabled


def shape_policy_decision(
    settings: EngineSettings, resolved: ResolvedSpeculative
) -> ResolvedShapePolicy:
    """The draft shapes the worker runs (``speculative.policy``), the configured one first."""
    speculative = settings.speculative
    return resolve_shape_policy(
        speculative.policy,
        speculative.candidate_shapes,
        DraftShape(resolved.num_steps, resolved.topk, resolved.num_draft_tokens),
        worker=resolved.worker,
        tp_size=settings.parallel.tp_size,
        shards_dense=shards_dense_over_dp(settings),
    )


def decode_buckets(
    graphs: ResolvedCudaGraphs, shapes: ResolvedShapePolicy, max_batch_size: int
) -> tuple[int, ...]:
    """The batch sizes decode steps are padded to: the graphs' buckets, which an adaptive
    policy prices its shapes at even where the steps run eagerly; none otherwise."""
    on = graphs.enabled or shapes.policy == "adaptive"
    return graph_buckets(max_batch_size) if on else ()


def started_worker(
    worker: Worker, use_cuda_graphs: bool, progress: Callable[[str], None] | None
) -> Worker:
    """``worker`` after capturing its decode step's graphs when they are on, and measuring
    what its per-step choices need (progress lines through ``progress``, default: the
    ``eagletree.engine`` logger)."""
    if use_cuda_graphs:
        worker.capture_graphs(progress)
    worker.calibrate(progress)
    return worker


def assemble_engine(
    worker: Worker,
    allocator: TokenSlotAllocator,
    req_to_token_pool: ReqToTokenPool,
    *,
    vocab_size: int,
    max_context_len: int,
    max_running_requests: int,
    eos_token_ids: Collection[int],
    tokenizer: Tokenizer | None,
    overlap: bool = False,
    prefill_step: PrefillStep = "with_decode",
    phases: PhaseAgreement | None = None,
    warm_up: bool = False,
    progress: Callable[[str], None] | None = None,
) -> Engine:
    """The engine over the built parts, with the checkpoint's tokenizer (None: ids only);
    ``overlap``: it keeps one step in flight (``scheduler.overlap``); ``prefill_step``: where
    a plan's prefills run (``scheduler.prefill_step``); ``phases``: the agreement of a group
    sharing its dense layers; ``warm_up``: its prefills compiled before it is handed over
    (``Engine.warm_up``, ``warms_up``; its time a line through ``progress``, default: the
    ``eagletree.engine`` logger — on a fresh machine it compiles every prefill kernel)."""
    engine = Engine(
        worker,
        allocator,
        req_to_token_pool,
        vocab_size=vocab_size,
        max_context_len=max_context_len,
        max_running_requests=max_running_requests,
        eos_token_ids=eos_token_ids,
        overlap=overlap,
        prefill_step=prefill_step,
        phases=phases,
    )
    engine.tokenizer = tokenizer
    if warm_up:
        started = time.perf_counter()
        lengths = engine.warm_up()
        (progress or _log.info)(
            f"warmed up the prefills of {lengths} prompt lengths in "
            f"{time.perf_counter() - started:.1f} s"
        )
    return engine


def warms_up(settings: EngineSettings, use_cuda_graphs: bool) -> bool:
    """Whether a new engine runs its warm-up prefills: where its decode steps were captured
    (CUDA; the kernels a prefill compiles are Triton's), in a single process (a group's ranks
    would each have to step through them together)."""
    parallel = settings.parallel
    return use_cuda_graphs and parallel.tp_size == 1 and parallel.dp_size == 1


def eos_token_ids(path: str | Path) -> frozenset[int]:
    """End-of-sequence ids of a checkpoint: ``eos_token_id`` of config.json and of
    generation_config.json (an int, a list, or absent), united."""
    ids: set[int] = set()
    for name in ("config.json", "generation_config.json"):
        file = Path(path) / name
        if not file.is_file():
            continue
        try:
            config = json.loads(file.read_text())
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ConfigurationError(
                f"{file} is not valid JSON ({error}): fix or remove it"
            ) from None
        if not isinstance(config, dict):
            raise ConfigurationError(f"{file}: expected a JSON object at the top level")
        value = config.get("eos_token_id")
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list):
            ids.update(v for v in value if isinstance(v, int))
    return frozenset(ids)
