"""Builds an Engine from settings: load the checkpoints, describe the target, wire the container."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from dependency_injector import providers

from eagletree.adapters.models.config import ConfigReader
from eagletree.adapters.models.loading import eagle3_aux_layer_ids, load_draft, load_target
from eagletree.adapters.models.runner import DraftModelRunner, TargetModelRunner
from eagletree.adapters.models.stack import MHALayout
from eagletree.adapters.text.hf_tokenizer import load_tokenizer
from eagletree.app import factories
from eagletree.app.container import Container, build_container, container_values
from eagletree.app.engine import Engine
from eagletree.app.platform import resolve_platform
from eagletree.app.workers.non_speculative import NonSpeculativeWorker
from eagletree.app.workers.step_graphs import graph_buckets
from eagletree.config.cuda_graphs import ResolvedCudaGraphs, resolve_cuda_graphs
from eagletree.config.overlap import resolve_overlap
from eagletree.config.target import TargetDescription
from eagletree.domain.errors import ConfigurationError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from eagletree.adapters.models.loading import DraftKind, DraftModel, TargetModel
    from eagletree.app.workers.step import Worker
    from eagletree.app.workers.step_kernels import StepKernels
    from eagletree.config.eagle_hook import ResolvedSpeculative
    from eagletree.config.settings import EngineSettings
    from eagletree.ports.memory import TokenSlotAllocator
    from eagletree.ports.model import DraftRunner, ModelRunner


_log = logging.getLogger("eagletree.engine")


class GraphPlan:
    """The resolved CUDA-graph decision and the buckets it captures (empty when disabled)."""

    def __init__(self, resolved: ResolvedCudaGraphs, max_batch_size: int) -> None:
        self.resolved = resolved
        self.buckets = graph_buckets(max_batch_size) if resolved.enabled else ()


def engine_from_settings(
    settings: EngineSettings, progress: Callable[[str], None] | None = None
) -> Engine:
    """The engine of ``settings.model.target_path``; ConfigurationError says what to change.

    With speculation the draft head(s) of ``model.draft_path`` (the target checkpoint's MTP
    layers for ``mtp``) get KV pools of the target pool's size over the same slot allocator and
    req_to_token table, and the worker is the one ``ResolvedSpeculative.worker`` names. When
    ``backend.cuda_graph`` resolves on, the decode step's graphs are captured before returning,
    with progress lines through ``progress`` (default: the ``eagletree.engine`` logger).
    """
    settings = resolve_platform(settings)
    target_path = settings.model.target_path
    if target_path is None:
        raise ConfigurationError(
            "model.target_path is unset: set it to a checkpoint directory (config.json + "
            "safetensors), e.g. one written by `eagletree init-random`"
        )
    parallel = settings.parallel
    if parallel.dp_size != 1 or parallel.tp_size != 1:
        raise ConfigurationError(
            f"parallel.dp_size = {parallel.dp_size}, parallel.tp_size = {parallel.tp_size}: "
            "this release runs one engine on one device; set both to 1 (data parallelism: run "
            "one engine per device)"
        )
    if not Path(target_path).is_dir():
        raise ConfigurationError(
            f"model.target_path = {target_path!r} is not a directory: point it at a checkpoint "
            "(config.json + safetensors), e.g. one written by `eagletree init-random`"
        )
    dtype = factories.torch_dtype(settings.model.dtype)
    model = load_target(
        target_path, dtype, settings.model.device, _aux_layer_ids(settings, target_path)
    )
    target = describe_target(target_path, model)
    check_context_len(settings, target)
    container = build_container(settings, target)
    resolved = container.speculative()
    check_topk(resolved, model.config.vocab_size)
    tokenizer = load_tokenizer(target_path)
    runner = TargetModelRunner(
        model,
        kv_pool=container.kv_pool(),
        req_to_token_pool=container.req_to_token_pool(),
        attention_backend=container.attention_backend(),
    )
    max_context_len = settings.model.max_context_len or target.max_position_embeddings
    device_type = next(model.parameters()).device.type
    graphs = GraphPlan(
        resolve_cuda_graphs(settings, device_type, resolved.worker), resolved.max_running_requests
    )
    if graphs.resolved.reason is not None:
        _log.info("decode steps run eagerly: %s", graphs.resolved.reason)
    kernels = container.step_kernels()
    worker: Worker
    if not resolved.enabled:
        worker = NonSpeculativeWorker(
            runner,
            kernels=kernels,
            graph_buckets=graphs.buckets,
            use_cuda_graphs=graphs.resolved.enabled,
        )
    else:
        assert resolved.draft_path is not None  # resolve_speculative names one when enabled
        kind: DraftKind = resolved.algorithm  # type: ignore[assignment]
        heads = load_draft(resolved.draft_path, kind, model, dtype)
        drafts = [_draft_runner(head, settings, target, resolved, container) for head in heads]
        worker = speculative_worker(
            resolved,
            runner,
            drafts,
            container.slot_allocator(),
            draft_hidden_size=heads[0].hidden_size,
            use_aux_hidden=kind == "eagle3",
            kernels=kernels,
            graphs=graphs,
        )
    if graphs.resolved.enabled:
        capture = getattr(worker, "capture_graphs", None)
        assert capture is not None, f"{type(worker).__name__} cannot capture CUDA graphs"
        capture(progress)
    engine = Engine(
        worker,
        container.slot_allocator(),
        container.req_to_token_pool(),
        vocab_size=runner.vocab_size,
        max_context_len=max_context_len,
        max_running_requests=resolved.max_running_requests,
        eos_token_ids=eos_token_ids(target_path),
        overlap=resolve_overlap(settings, device_type, resolved.worker).enabled,
    )
    engine.tokenizer = tokenizer
    return engine


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


def _aux_layer_ids(settings: EngineSettings, target_path: str) -> tuple[int, ...]:
    """The target layers an EAGLE-3 draft reads (none for other algorithms)."""
    draft_path = settings.model.draft_path
    if settings.speculative.algorithm != "eagle3" or draft_path is None:
        return ()
    num_layers = ConfigReader.from_dir(target_path).get_int("num_hidden_layers")
    return eagle3_aux_layer_ids(draft_path, num_layers)


def _draft_runner(
    head: DraftModel,
    settings: EngineSettings,
    target: TargetDescription,
    resolved: ResolvedSpeculative,
    container: Container,
) -> DraftModelRunner:
    """A runner of ``head`` over a KV pool of its own, built by a container that describes the
    head's KV layout and shares the target container's allocator and req_to_token table."""
    layout = head.kv_layout
    if isinstance(layout, MHALayout):
        described = replace(
            target,
            attention_kind="mha",
            num_layers=layout.layer_num,
            num_kv_heads=layout.kv_heads,
            head_dim=layout.head_dim,
            v_head_dim=layout.v_head_dim,
        )
    else:
        described = replace(
            target,
            attention_kind="mla",
            num_layers=layout.layer_num,
            kv_lora_rank=layout.kv_lora_rank,
            qk_rope_head_dim=layout.qk_rope_head_dim,
        )
    draft_container = Container(
        target=providers.Object(described), speculative=providers.Object(resolved)
    )
    draft_container.config.from_dict(container_values(settings, described, resolved))
    draft_container.slot_allocator.override(providers.Object(container.slot_allocator()))
    draft_container.req_to_token_pool.override(providers.Object(container.req_to_token_pool()))
    return DraftModelRunner(
        head,
        kv_pool=draft_container.kv_pool(),
        req_to_token_pool=draft_container.req_to_token_pool(),
        attention_backend=draft_container.attention_backend(),
    )


def speculative_worker(
    resolved: ResolvedSpeculative,
    target: ModelRunner,
    drafts: Sequence[DraftRunner],
    allocator: TokenSlotAllocator,
    *,
    draft_hidden_size: int,
    use_aux_hidden: bool,
    kernels: StepKernels,
    graphs: GraphPlan,
) -> Worker:
    """The worker ``resolved.worker`` names, over the target runner and the draft runner(s)."""
    steps, topk, tokens = resolved.num_steps, resolved.topk, resolved.num_draft_tokens
    if resolved.worker == "eagle_v2":
        from eagletree.app.workers.eagle_v2 import EagleWorkerV2

        return EagleWorkerV2(
            target,
            drafts[0],
            num_steps=steps,
            topk=topk,
            num_draft_tokens=tokens,
            draft_hidden_size=draft_hidden_size,
            use_aux_hidden=use_aux_hidden,
            kernels=kernels,
            graph_buckets=graphs.buckets,
            use_cuda_graphs=graphs.resolved.enabled,
        )
    if resolved.worker == "eagle_v1":
        from eagletree.app.workers.eagle_v1 import EagleWorkerV1

        return EagleWorkerV1(
            target,
            drafts[0],
            allocator=allocator,
            num_steps=steps,
            topk=topk,
            num_draft_tokens=tokens,
            draft_hidden_size=draft_hidden_size,
            use_aux_hidden=use_aux_hidden,
            kernels=kernels,
        )
    if resolved.worker == "multi_layer_eagle_v2":
        from eagletree.app.workers.multi_layer_v2 import MultiLayerEagleWorkerV2

        return MultiLayerEagleWorkerV2(
            target,
            drafts,
            num_steps=steps,
            topk=topk,
            num_draft_tokens=tokens,
            draft_hidden_size=draft_hidden_size,
            use_aux_hidden=use_aux_hidden,
            kernels=kernels,
            graph_buckets=graphs.buckets,
            use_cuda_graphs=graphs.resolved.enabled,
        )
    raise ConfigurationError(f"no speculative worker is called {resolved.worker!r}")


def describe_target(path: str | Path, model: TargetModel) -> TargetDescription:
    """What the settings rules and the pools need to know about a loaded target."""
    known = TargetDescription.for_architecture(ConfigReader.from_dir(path).architecture())
    layout = model.kv_layout
    known = replace(
        known,
        num_layers=layout.layer_num,
        max_position_embeddings=model.config.max_position_embeddings,
        num_mtp_layers=getattr(model.config, "num_nextn_predict_layers", 0),
    )
    if isinstance(layout, MHALayout):
        return replace(
            known,
            attention_kind="mha",
            num_kv_heads=layout.kv_heads,
            head_dim=layout.head_dim,
            v_head_dim=layout.v_head_dim,
        )
    return replace(
        known,
        attention_kind="mla" if known.attention_kind == "mha" else known.attention_kind,
        kv_lora_rank=layout.kv_lora_rank,
        qk_rope_head_dim=layout.qk_rope_head_dim,
    )


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
