"""Composition root: the only package that names concrete adapters.

The container provides everything an engine is made of: the loaded target and draft models,
the target description read from them, the resolved speculative parameters, the memory pools,
the attention backends, the runners (one per draft head), the worker, the engine and its
scheduler. Its strict ``Configuration`` holds the settings (``"auto"`` already resolved for the
machine); everything else is a provider, built on first use, so a test swaps any part with
``override`` before asking for the engine. ``Selector``s pick adapters by name and only the
selected branch is ever built.

``Container`` is built in three layers, one module each: ``models.ModelProviders`` (the rank,
the models and what the settings rules learn from them), ``pools.PoolProviders`` (memory,
attention backends, runners) and, here, the worker and the engine on top.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from dependency_injector import providers

from eagletree.adapters.kernels.triton import beam_step as triton_beam_step
from eagletree.adapters.kernels.triton import chain_sampling as triton_chain_sampling
from eagletree.adapters.kernels.triton import coins as triton_coins
from eagletree.adapters.kernels.triton import compaction as triton_compaction
from eagletree.adapters.kernels.triton import draft_topk as triton_draft_topk
from eagletree.adapters.kernels.triton import draw_children as triton_draw_children
from eagletree.adapters.kernels.triton import path_ranks as triton_path_ranks
from eagletree.adapters.kernels.triton import plain_step_writes as triton_plain_step_writes
from eagletree.adapters.kernels.triton import row_argmax as triton_row_argmax
from eagletree.adapters.kernels.triton import tempered_probs as triton_tempered_probs
from eagletree.adapters.kernels.triton import tree_build as triton_tree_build
from eagletree.adapters.kernels.triton import tree_sampling as triton_tree_sampling
from eagletree.adapters.kernels.triton import tree_verify as triton_tree_verify
from eagletree.adapters.models.config import ConfigReader
from eagletree.adapters.models.head_report import read_rank_priors
from eagletree.app.composition import startup
from eagletree.app.composition.model_providers import (
    ModelProviders,
)
from eagletree.app.composition.platform import apply_cpu_threads, resolve_platform
from eagletree.app.composition.pool_providers import PoolProviders
from eagletree.app.engine.loop import Engine
from eagletree.app.engine.phases import PhaseAgreement
from eagletree.app.parallel import distributed
from eagletree.app.parallel.data_parallel import DataParallelEngine
from eagletree.app.workers.eagle_v1 import EagleWorkerV1
from eagletree.app.workers.eagle_v2 import EagleWorkerV2
from eagletree.app.workers.multi_layer_v2 import MultiLayerEagleWorkerV2
from eagletree.app.workers.non_speculative import NonSpeculativeWorker
from eagletree.app.workers.shapes.adaptive import AdaptiveShapes
from eagletree.app.workers.step_kernels import REFERENCE_KERNELS, StepKernels
from eagletree.config.settings import EngineSettings
from eagletree.config.target import TargetDescription
from eagletree.domain.errors import ConfigurationError


def reads_aux_hidden(algorithm: str) -> bool:
    """Whether the draft reads the target's aux hidden states (EAGLE-3 does)."""
    return algorithm == "eagle3"


def phase_agreement_of(groups: distributed.ParallelGroups) -> PhaseAgreement | None:
    """How the engine agrees on its steps' phases with a group sharing its dense layers."""
    return None if groups.dense_group is None else PhaseAgreement(groups.dp_group)


def target_hidden_size(target_path: str | None) -> int:
    """The target's hidden size from its config.json (the CPU thread policy reads it)."""
    assert target_path is not None  # check_engine_settings refuses an unset one
    return ConfigReader.from_dir(target_path).get_int("hidden_size")


def kernel_backend(device: str) -> str:
    """Which implementation of the fused step functions runs on ``device``."""
    return "triton" if torch.device(device).type == "cuda" else "torch"


class Container(PoolProviders):
    """Providers of one engine; see ``build_engine_container`` and ``build_container``."""

    # -- the worker ----------------------------------------------------------------------------
    # a step's fused device functions: one Triton launch each on CUDA, the torch references
    # (domain/) elsewhere
    step_kernels = providers.Selector(
        providers.Callable(kernel_backend, ModelProviders.config.model.device),
        torch=providers.Object(REFERENCE_KERNELS),
        triton=providers.Singleton(
            StepKernels,
            coins=triton_coins.uniform_coins,
            argmax=triton_row_argmax.row_argmax,
            tempered_probs=triton_tempered_probs.tempered_probs,
            sample=triton_draw_children.sample_from_probs,
            top_k=triton_draft_topk.top_k_probs,
            build_tree=triton_tree_build.build_tree,
            beam_step=triton_beam_step.beam_step,
            compaction_plan=triton_compaction.compaction_plan,
            verify_greedy=triton_tree_verify.verify_tree_greedy,
            path_ranks=triton_path_ranks.accepted_path_ranks,
            plain_step_writes=triton_plain_step_writes.plain_step_writes,
            draw_children=triton_draw_children.draw_children,
            verify_drawn=triton_tree_sampling.verify_tree_drawn,
            verify_chain=triton_chain_sampling.verify_chain_drawn,
        ),
    )
    cuda_graphs = providers.Singleton(
        startup.cuda_graph_decision,
        ModelProviders.settings,
        ModelProviders.device.provided.type,
        ModelProviders.worker_name,
    )
    use_cuda_graphs = cuda_graphs.provided.enabled
    shape_policy = ModelProviders.shape_policy
    graph_buckets = providers.Callable(
        startup.decode_buckets, cuda_graphs, shape_policy, ModelProviders.max_running_requests
    )
    # the policy that picks each step's shape among them
    policy = providers.Selector(
        shape_policy.provided.policy,
        fixed=providers.Object(None),
        adaptive=providers.Singleton(
            AdaptiveShapes,
            shape_policy.provided.shapes,
            head_priors=providers.Callable(
                read_rank_priors, ModelProviders.speculative.provided.draft_path
            ),
            drawn_drafts=ModelProviders.speculative.provided.draw_drafts,
        ),
    )
    num_steps = ModelProviders.speculative.provided.num_steps
    topk = ModelProviders.speculative.provided.topk
    num_draft_tokens = ModelProviders.speculative.provided.num_draft_tokens
    draft_hidden_size = ModelProviders.draft_models.provided[0].hidden_size
    use_aux_hidden = providers.Callable(
        reads_aux_hidden, ModelProviders.config.speculative.algorithm
    )
    # the phases of each step agreed with a data-parallel group sharing the dense layers
    phase_agreement = providers.Singleton(phase_agreement_of, ModelProviders.parallel_groups)
    # the engine keeps one step in flight; the plain worker then keeps its tokens on the device
    overlap = providers.Singleton(
        startup.overlap_decision,
        ModelProviders.settings,
        ModelProviders.device.provided.type,
        ModelProviders.worker_name,
    )
    # a speculative worker over its runners, given the tree's shape and the step functions
    # (a class-body helper, deleted below: not a provider)
    _speculative_worker = partial(
        providers.Singleton,
        num_steps=num_steps,
        topk=topk,
        num_draft_tokens=num_draft_tokens,
        draft_hidden_size=draft_hidden_size,
        use_aux_hidden=use_aux_hidden,
        kernels=step_kernels,
    )
    worker = providers.Selector(
        ModelProviders.worker_name,
        none=providers.Singleton(
            NonSpeculativeWorker,
            PoolProviders.target_runner,
            kernels=step_kernels,
            graph_buckets=graph_buckets,
            use_cuda_graphs=use_cuda_graphs,
            run_ahead=overlap,
        ),
        eagle_v2=_speculative_worker(
            EagleWorkerV2,
            PoolProviders.target_runner,
            PoolProviders.draft_runners.provided[0],
            graph_buckets=graph_buckets,
            use_cuda_graphs=use_cuda_graphs,
            policy=policy,
            draw_drafts=ModelProviders.speculative.provided.draw_drafts,
        ),
        eagle_v1=_speculative_worker(
            EagleWorkerV1,
            PoolProviders.target_runner,
            PoolProviders.draft_runners.provided[0],
            allocator=PoolProviders.slot_allocator,
            draw_drafts=ModelProviders.speculative.provided.draw_drafts,
        ),
        multi_layer_eagle_v2=_speculative_worker(
            MultiLayerEagleWorkerV2,
            PoolProviders.target_runner,
            PoolProviders.draft_runners,
            graph_buckets=graph_buckets,
            use_cuda_graphs=use_cuda_graphs,
        ),
    )
    del _speculative_worker

    # -- the engine ----------------------------------------------------------------------------
    # the worker with its CUDA graphs captured and its step costs measured (after it is built,
    # before the engine runs)
    started_worker = providers.Singleton(
        startup.started_worker, worker, use_cuda_graphs, ModelProviders.progress
    )
    engine = providers.Singleton(
        startup.assemble_engine,
        started_worker,
        PoolProviders.slot_allocator,
        PoolProviders.req_to_token_pool,
        vocab_size=PoolProviders.target_runner.provided.vocab_size,
        max_context_len=ModelProviders.max_context_len,
        max_running_requests=ModelProviders.max_running_requests,
        tokenizer=ModelProviders.tokenizer,
        eos_token_ids=providers.Callable(
            startup.eos_token_ids, ModelProviders.config.model.target_path
        ),
        overlap=overlap,
        prefill_step=ModelProviders.config.scheduler.prefill_step,
        phases=phase_agreement,
        warm_up=providers.Callable(startup.warms_up, ModelProviders.settings, use_cuda_graphs),
        progress=ModelProviders.progress,
    )
    scheduler = engine.provided.scheduler


def build_engine(settings: EngineSettings, progress: Callable[[str], None] | None = None) -> Engine:
    """The engine of ``settings``: its target checkpoint loaded and everything wired around it
    (``progress`` receives the lines of long start-up work, e.g. CUDA-graph capture).

    ConfigurationError says what to change: for the settings alone before anything loads,
    for what the checkpoints contradict once they are read. A data-parallel group
    (``parallel.dp_size`` > 1) builds each rank's engine with ``build_data_parallel_engine``.
    """
    if settings.parallel.dp_size != 1:
        raise ConfigurationError(
            f"parallel.dp_size = {settings.parallel.dp_size}: a data-parallel rank's engine "
            "holds only the requests routed to it; build the group's engine on every rank "
            "with eagletree.app.composition.container.build_data_parallel_engine (or run "
            "eagletree generate --dp N), or set parallel.dp_size = 1"
        )
    return build_engine_container(settings, progress).engine()


def build_data_parallel_engine(
    settings: EngineSettings, progress: Callable[[str], None] | None = None
) -> DataParallelEngine:
    """This rank's engine of ``settings`` (``parallel.dp_size`` ranks, each with
    ``parallel.tp_size`` tensor-parallel ones), in the already joined process group of
    dp_size · tp_size ranks (``process_group.join_process_group`` or torchrun)."""
    container = build_engine_container(settings, progress)
    groups = container.parallel_groups()  # every group made before any model needs one
    return DataParallelEngine(container.engine(), groups)


def build_engine_container(
    settings: EngineSettings, progress: Callable[[str], None] | None = None
) -> Container:
    """The container of the engine of ``settings.model.target_path``; nothing is loaded yet.

    ``container.engine()`` loads the target (with EAGLE-3's aux layers when the draft is
    EAGLE-3) and, with speculation, the draft head(s) of ``resolved.draft_path`` (the target
    checkpoint's MTP layers for ``mtp``), builds the worker ``resolved.worker`` names and, when
    ``backend.cuda_graph`` resolves on, captures its decode graphs with progress lines through
    ``progress`` (default: the ``eagletree.engine`` logger). For an engine on the CPU it sets
    torch's threads process-wide now, as ``backend.cpu_threads`` says (``platform``).
    ConfigurationError says what to change, here for the settings alone, from ``engine()``
    for what the checkpoints contradict.
    """
    settings = resolve_platform(settings)
    startup.check_engine_settings(settings)
    # before anything reads the checkpoint: a launch error says how to launch, whatever the path
    distributed.check_world(settings.parallel.tp_size, settings.parallel.dp_size)
    apply_cpu_threads(settings, partial(target_hidden_size, settings.model.target_path))
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
