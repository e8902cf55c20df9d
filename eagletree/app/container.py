"""Composition root: the only module that names concrete adapters.

The container provides everything an engine is made of: the loaded target and draft models,
the target description read from them, the resolved speculative parameters, the memory pools,
the attention backends, the runners (one per draft head), the worker, the engine and its
scheduler. Its strict ``Configuration`` holds the settings (``"auto"`` already resolved for the
machine); everything else is a provider, built on first use, so a test swaps any part with
``override`` before asking for the engine. ``Selector``s pick adapters by name and only the
selected branch is ever built.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from dependency_injector import containers, providers

from eagletree.adapters.attention.torch_backend import TorchAttentionBackend
from eagletree.adapters.attention.triton_backend import TritonAttentionBackend
from eagletree.adapters.kernels.triton import beam_step as triton_beam_step
from eagletree.adapters.kernels.triton import coins as triton_coins
from eagletree.adapters.kernels.triton import compaction as triton_compaction
from eagletree.adapters.kernels.triton import draft_topk as triton_draft_topk
from eagletree.adapters.kernels.triton import row_argmax as triton_row_argmax
from eagletree.adapters.kernels.triton import tree_build as triton_tree_build
from eagletree.adapters.kernels.triton import tree_verify as triton_tree_verify
from eagletree.adapters.memory.dsa_pool import DSAKVPool
from eagletree.adapters.memory.mha_pool import MHAKVPool
from eagletree.adapters.memory.mla_pool import MLAKVPool
from eagletree.adapters.memory.req_to_token import TensorReqToTokenPool
from eagletree.adapters.memory.row_movers import TorchRowMover, TritonRowMover
from eagletree.adapters.memory.slot_allocator import DeviceSlotAllocator
from eagletree.adapters.models.config import ConfigReader
from eagletree.adapters.models.dense_group import DenseGroup
from eagletree.adapters.models.loading import eagle3_aux_layer_ids, load_draft, load_target
from eagletree.adapters.models.runner import DraftModelRunner, TargetModelRunner
from eagletree.adapters.models.stack import MHALayout
from eagletree.adapters.models.tensor_parallel import SINGLE, TensorParallel
from eagletree.adapters.text.hf_tokenizer import load_tokenizer
from eagletree.app import distributed, factories, sizing, startup
from eagletree.app.platform import resolve_platform
from eagletree.app.step_phases import PhaseAgreement
from eagletree.app.workers.eagle_v1 import EagleWorkerV1
from eagletree.app.workers.eagle_v2 import EagleWorkerV2
from eagletree.app.workers.multi_layer_v2 import MultiLayerEagleWorkerV2
from eagletree.app.workers.non_speculative import NonSpeculativeWorker
from eagletree.app.workers.step_kernels import REFERENCE_KERNELS, StepKernels
from eagletree.config.eagle_hook import resolve_speculative
from eagletree.config.settings import EngineSettings
from eagletree.config.target import TargetDescription

if TYPE_CHECKING:
    from eagletree.adapters.models.loading import DraftKind, DraftModel, TargetModel
    from eagletree.config.eagle_hook import ResolvedSpeculative
    from eagletree.ports.attention import AttentionBackend
    from eagletree.ports.memory import KVPool, ReqToTokenPool


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


def described_target(settings: EngineSettings, path: str, model: TargetModel) -> TargetDescription:
    """``describe_target``, refusing a ``model.max_context_len`` beyond the target's limit."""
    target = describe_target(path, model)
    startup.check_context_len(settings, target)
    return target


def aux_layer_ids(algorithm: str, target_path: str, draft_path: str | None) -> tuple[int, ...]:
    """The target layers an EAGLE-3 draft reads (none for other algorithms)."""
    if algorithm != "eagle3" or draft_path is None:
        return ()
    num_layers = ConfigReader.from_dir(target_path).get_int("num_hidden_layers")
    return eagle3_aux_layer_ids(draft_path, num_layers)


def load_draft_heads(
    resolved: ResolvedSpeculative, target: TargetModel, dtype: torch.dtype
) -> list[DraftModel]:
    """The draft head(s) of ``resolved.draft_path``: one for EAGLE / EAGLE-3, one per MTP layer."""
    startup.check_topk(resolved, target.config.vocab_size)
    assert resolved.draft_path is not None  # resolve_speculative names one when enabled
    kind: DraftKind = resolved.algorithm  # type: ignore[assignment]
    return load_draft(resolved.draft_path, kind, target, dtype)


def build_draft_runners(
    heads: Sequence[DraftModel],
    *,
    mha_kv_pool: Callable[..., KVPool],
    mla_kv_pool: Callable[..., KVPool],
    attention_backend_over: Callable[..., AttentionBackend],
    req_to_token_pool: ReqToTokenPool,
) -> list[DraftModelRunner]:
    """A runner per head over a KV pool of its own layout (the target pool's size), sharing
    the target's req_to_token table (and through it the slot allocator's slot ids)."""
    runners = []
    for head in heads:
        layout = head.kv_layout
        if isinstance(layout, MHALayout):
            pool = mha_kv_pool(
                layer_num=layout.layer_num,
                kv_heads=layout.kv_heads,
                head_dim=layout.head_dim,
                v_head_dim=layout.v_head_dim,
            )
        else:
            pool = mla_kv_pool(
                layer_num=layout.layer_num,
                kv_lora_rank=layout.kv_lora_rank,
                qk_rope_head_dim=layout.qk_rope_head_dim,
            )
        backend = attention_backend_over(kv_pool=pool)
        runners.append(
            DraftModelRunner(
                head, kv_pool=pool, req_to_token_pool=req_to_token_pool, attention_backend=backend
            )
        )
    return runners


def tensor_parallel_of(groups: distributed.ParallelGroups) -> TensorParallel:
    """This rank's place in the group its models are sharded over."""
    if groups.tp_group is None:
        return SINGLE
    return TensorParallel(groups.tp_rank, groups.tp_size, groups.tp_group)


def dense_group_of(groups: distributed.ParallelGroups) -> DenseGroup | None:
    """The data-parallel group this rank's dense layers are sharded over; None when they are
    not (``parallel.shard_dense_over_dp`` off, or one replica)."""
    if groups.dense_group is None:
        return None
    tp = TensorParallel(groups.dp_rank, groups.dp_size, groups.dense_group)
    return DenseGroup(tp, count_group=groups.dp_group)


def phase_agreement_of(groups: distributed.ParallelGroups) -> PhaseAgreement | None:
    """How the engine agrees on its steps' phases with a group sharing its dense layers."""
    return None if groups.dense_group is None else PhaseAgreement(groups.dp_group)


def reads_aux_hidden(algorithm: str) -> bool:
    """Whether the draft reads the target's aux hidden states (EAGLE-3 does)."""
    return algorithm == "eagle3"


def kernel_backend(device: str) -> str:
    """Which implementation of the fused step functions runs on ``device``."""
    return "triton" if torch.device(device).type == "cuda" else "torch"


class Container(containers.DeclarativeContainer):
    """Providers of one engine; see ``build_engine_container`` and ``build_container``."""

    config = providers.Configuration(strict=True)
    settings = providers.Dependency(instance_of=EngineSettings)
    # receives the progress lines of long start-up work (CUDA-graph capture); None: the logger
    progress: providers.Object[Callable[[str], None] | None] = providers.Object(None)

    # the groups of this rank: the models are sharded over the tensor-parallel one, the
    # data-parallel engine steps in lockstep over the other (one rank of each by default)
    parallel_groups = providers.Singleton(
        distributed.parallel_groups,
        config.parallel.tp_size,
        config.parallel.dp_size,
        config.parallel.shard_dense_over_dp,
    )
    tensor_parallel = providers.Singleton(tensor_parallel_of, parallel_groups)
    # with parallel.shard_dense_over_dp: the MLP, embedding and lm_head over the dp group
    dense_group = providers.Singleton(dense_group_of, parallel_groups)
    phase_agreement = providers.Singleton(phase_agreement_of, parallel_groups)
    device = providers.Singleton(
        distributed.rank_device,
        config.model.device,
        providers.Callable(distributed.group_rank),
        providers.Callable(distributed.world_size),
    )
    dtype = providers.Callable(factories.torch_dtype, config.model.dtype)

    # -- models and what the settings rules learn from them -----------------------------------
    target_model = providers.Singleton(
        load_target,
        config.model.target_path,
        dtype,
        device,
        providers.Callable(
            aux_layer_ids,
            config.speculative.algorithm,
            config.model.target_path,
            config.model.draft_path,
        ),
        tp=tensor_parallel,
        dense=dense_group,
    )
    target = providers.Singleton(described_target, settings, config.model.target_path, target_model)
    speculative = providers.Singleton(resolve_speculative, settings, target)
    draft_models = providers.Singleton(load_draft_heads, speculative, target_model, dtype)
    tokenizer = providers.Singleton(load_tokenizer, config.model.target_path)

    worker_name = providers.Callable(str, speculative.provided.worker)
    max_running_requests = speculative.provided.max_running_requests
    max_context_len = providers.Callable(
        sizing.max_context_len,
        config.model.max_context_len,
        target.provided.max_position_embeddings,
    )

    # -- memory --------------------------------------------------------------------------------
    kv_mover = providers.Selector(
        config.backend.kv_move,
        torch=providers.Singleton(TorchRowMover, debug_checks=config.memory.debug_checks),
        triton=providers.Singleton(TritonRowMover, debug_checks=config.memory.debug_checks),
    )
    slot_allocator = providers.Singleton(
        DeviceSlotAllocator,
        size=config.memory.max_total_tokens,
        device=device,
        debug_checks=config.memory.debug_checks,
    )
    req_to_token_pool = providers.Singleton(
        TensorReqToTokenPool,
        max_requests=providers.Callable(sizing.req_to_token_rows, max_running_requests),
        row_width=providers.Callable(
            sizing.req_to_token_row_width, max_context_len, speculative, config.memory.page_size
        ),
        device=device,
    )

    # KV pools of one kind; the layer dimensions come with the call (the target's, a draft's)
    mha_kv_pool = providers.Factory(
        MHAKVPool,
        size=config.memory.max_total_tokens,
        dtype=dtype,
        device=device,
        mover=kv_mover,
        page_size=config.memory.page_size,
        debug_checks=config.memory.debug_checks,
    )
    mla_kv_pool = providers.Factory(
        MLAKVPool,
        size=config.memory.max_total_tokens,
        dtype=dtype,
        device=device,
        mover=kv_mover,
        page_size=config.memory.page_size,
        debug_checks=config.memory.debug_checks,
    )
    dsa_kv_pool = providers.Factory(
        DSAKVPool,
        size=config.memory.max_total_tokens,
        dtype=dtype,
        device=device,
        mover=kv_mover,
        page_size=config.memory.page_size,
        debug_checks=config.memory.debug_checks,
    )
    kv_pool = providers.Selector(
        target.provided.attention_kind,
        mha=providers.Singleton(
            mha_kv_pool,
            layer_num=target.provided.num_layers,
            kv_heads=target.provided.num_kv_heads,
            head_dim=target.provided.head_dim,
            v_head_dim=target.provided.v_head_dim,
        ),
        mla=providers.Singleton(
            mla_kv_pool,
            layer_num=target.provided.num_layers,
            kv_lora_rank=target.provided.kv_lora_rank,
            qk_rope_head_dim=target.provided.qk_rope_head_dim,
        ),
        dsa=providers.Singleton(
            dsa_kv_pool,
            layer_num=target.provided.num_layers,
            kv_lora_rank=target.provided.kv_lora_rank,
            qk_rope_head_dim=target.provided.qk_rope_head_dim,
        ),
    )

    # -- attention: a backend over a given pool, and the target pool's ------------------------
    attention_backend_over = providers.Selector(
        config.backend.attention,
        torch=providers.Factory(
            TorchAttentionBackend,
            req_to_token_pool=req_to_token_pool,
            max_batch_size=max_running_requests,
        ),
        triton=providers.Factory(
            TritonAttentionBackend,
            req_to_token_pool=req_to_token_pool,
            max_batch_size=max_running_requests,
        ),
        flash=providers.Factory(
            factories.flash_attention_backend,
            req_to_token_pool=req_to_token_pool,
            max_batch_size=max_running_requests,
        ),
    )
    attention_backend = providers.Singleton(attention_backend_over, kv_pool=kv_pool)

    # -- runners: the target's, and one per draft head over a KV pool of the head's layout -----
    target_runner = providers.Singleton(
        TargetModelRunner,
        target_model,
        kv_pool=kv_pool,
        req_to_token_pool=req_to_token_pool,
        attention_backend=attention_backend,
    )
    draft_runners = providers.Singleton(
        build_draft_runners,
        draft_models,
        mha_kv_pool=mha_kv_pool.provider,
        mla_kv_pool=mla_kv_pool.provider,
        attention_backend_over=attention_backend_over.provider,
        req_to_token_pool=req_to_token_pool,
    )

    # -- the worker ----------------------------------------------------------------------------
    # a step's fused device functions: one Triton launch each on CUDA, the torch references
    # (domain/) elsewhere
    step_kernels = providers.Selector(
        providers.Callable(kernel_backend, config.model.device),
        torch=providers.Object(REFERENCE_KERNELS),
        triton=providers.Singleton(
            StepKernels,
            coins=triton_coins.uniform_coins,
            argmax=triton_row_argmax.row_argmax,
            top_k=triton_draft_topk.top_k_probs,
            build_tree=triton_tree_build.build_tree,
            beam_step=triton_beam_step.beam_step,
            compaction_plan=triton_compaction.compaction_plan,
            verify_greedy=triton_tree_verify.verify_tree_greedy,
        ),
    )
    cuda_graphs = providers.Singleton(
        startup.cuda_graph_decision, settings, device.provided.type, worker_name
    )
    use_cuda_graphs = cuda_graphs.provided.enabled
    graph_buckets = providers.Callable(
        startup.cuda_graph_buckets, cuda_graphs, max_running_requests
    )
    num_steps = speculative.provided.num_steps
    topk = speculative.provided.topk
    num_draft_tokens = speculative.provided.num_draft_tokens
    draft_hidden_size = draft_models.provided[0].hidden_size
    use_aux_hidden = providers.Callable(reads_aux_hidden, config.speculative.algorithm)
    # the engine keeps one step in flight; the plain worker then keeps its tokens on the device
    overlap = providers.Singleton(
        startup.overlap_decision, settings, device.provided.type, worker_name
    )
    worker = providers.Selector(
        worker_name,
        none=providers.Singleton(
            NonSpeculativeWorker,
            target_runner,
            kernels=step_kernels,
            graph_buckets=graph_buckets,
            use_cuda_graphs=use_cuda_graphs,
            run_ahead=overlap,
        ),
        eagle_v2=providers.Singleton(
            EagleWorkerV2,
            target_runner,
            draft_runners.provided[0],
            num_steps=num_steps,
            topk=topk,
            num_draft_tokens=num_draft_tokens,
            draft_hidden_size=draft_hidden_size,
            use_aux_hidden=use_aux_hidden,
            kernels=step_kernels,
            graph_buckets=graph_buckets,
            use_cuda_graphs=use_cuda_graphs,
        ),
        eagle_v1=providers.Singleton(
            EagleWorkerV1,
            target_runner,
            draft_runners.provided[0],
            allocator=slot_allocator,
            num_steps=num_steps,
            topk=topk,
            num_draft_tokens=num_draft_tokens,
            draft_hidden_size=draft_hidden_size,
            use_aux_hidden=use_aux_hidden,
            kernels=step_kernels,
        ),
        multi_layer_eagle_v2=providers.Singleton(
            MultiLayerEagleWorkerV2,
            target_runner,
            draft_runners,
            num_steps=num_steps,
            topk=topk,
            num_draft_tokens=num_draft_tokens,
            draft_hidden_size=draft_hidden_size,
            use_aux_hidden=use_aux_hidden,
            kernels=step_kernels,
            graph_buckets=graph_buckets,
            use_cuda_graphs=use_cuda_graphs,
        ),
    )

    # -- the engine ----------------------------------------------------------------------------
    # the worker with its CUDA graphs captured (after it is built, before the engine runs)
    started_worker = providers.Singleton(
        startup.with_captured_graphs, worker, use_cuda_graphs, progress
    )
    engine = providers.Singleton(
        startup.assemble_engine,
        started_worker,
        slot_allocator,
        req_to_token_pool,
        vocab_size=target_runner.provided.vocab_size,
        max_context_len=max_context_len,
        max_running_requests=max_running_requests,
        tokenizer=tokenizer,
        eos_token_ids=providers.Callable(startup.eos_token_ids, config.model.target_path),
        overlap=overlap,
        prefill_step=config.scheduler.prefill_step,
        phases=phase_agreement,
    )
    scheduler = engine.provided.scheduler


def build_engine_container(
    settings: EngineSettings, progress: Callable[[str], None] | None = None
) -> Container:
    """The container of the engine of ``settings.model.target_path``; nothing is loaded yet.

    ``container.engine()`` loads the target (with EAGLE-3's aux layers when the draft is
    EAGLE-3) and, with speculation, the draft head(s) of ``resolved.draft_path`` (the target
    checkpoint's MTP layers for ``mtp``), builds the worker ``resolved.worker`` names and, when
    ``backend.cuda_graph`` resolves on, captures its decode graphs with progress lines through
    ``progress`` (default: the ``eagletree.engine`` logger). ConfigurationError says what to
    change, here for the settings alone, from ``engine()`` for what the checkpoints contradict.
    """
    settings = resolve_platform(settings)
    startup.check_engine_settings(settings)
    container = Container(settings=providers.Object(settings), progress=providers.Object(progress))
    container.config.from_dict(settings.model_dump())
    return container


def build_container(
    settings: EngineSettings | None = None, target: TargetDescription | None = None
) -> Container:
    """A container for ``target`` (a tiny MHA description when None) that loads no checkpoint:
    the settings (from the environment when None) resolved for the machine and wired.

    Raises ConfigurationError when the settings contradict each other or the target.
    """
    settings = resolve_platform(settings if settings is not None else EngineSettings())
    target = target if target is not None else TargetDescription()
    container = Container(settings=providers.Object(settings), target=providers.Object(target))
    container.config.from_dict(settings.model_dump())
    container.speculative()  # a contradiction stops the build
    return container
