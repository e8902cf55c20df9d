"""Tests of the composition root: each setting selects its adapter, sizes reach the pools, an
overridden provider is what the engine runs end to end."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import pytest
import torch
from dependency_injector import errors, providers

from eagletree.adapters.attention.torch_backend import TorchAttentionBackend
from eagletree.adapters.attention.triton_backend import TritonAttentionBackend
from eagletree.adapters.memory.dsa_pool import DSAKVPool
from eagletree.adapters.memory.mha_pool import MHAKVPool
from eagletree.adapters.memory.mla_pool import MLAKVPool
from eagletree.adapters.memory.req_to_token import TensorReqToTokenPool
from eagletree.adapters.memory.row_movers import TorchRowMover, TritonRowMover
from eagletree.adapters.memory.slot_allocator import DeviceSlotAllocator
from eagletree.adapters.models.random_checkpoint import write_random_checkpoint
from eagletree.app.composition import container as container_module
from eagletree.app.composition import factories
from eagletree.app.composition.container import Container, build_container, build_engine_container
from eagletree.app.composition.sizing import (
    ROW_HEADROOM,
    req_to_token_row_width,
    tokens_allocated_per_step,
)
from eagletree.app.workers.eagle_v2 import EagleWorkerV2
from eagletree.config.eagle_hook import ResolvedSpeculative, resolve_speculative
from eagletree.config.settings import EngineSettings
from eagletree.config.target import TargetDescription
from eagletree.domain.errors import ConfigurationError
from tests.integration.spec.harness import SIZES, WEIGHT_STD

SMALL_MEMORY = {"max_total_tokens": 64, "max_running_requests": 4}
TREE = {"algorithm": "eagle", "num_steps": 3, "eagle_topk": 4, "num_draft_tokens": 8}
CHECKPOINTS = {"target_path": "/t", "draft_path": "/d"}


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in os.environ:
        if name.startswith("EAGLETREE_"):
            monkeypatch.delenv(name)


@pytest.fixture(params=["cpu", "cuda"])
def device(request: pytest.FixtureRequest) -> str:
    if request.param == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    return str(request.param)


def settings(
    device: str = "cpu",
    *,
    model: dict[str, Any] | None = None,
    speculative: dict[str, Any] | None = None,
    memory: dict[str, Any] | None = None,
    backend: dict[str, Any] | None = None,
) -> EngineSettings:
    return EngineSettings(
        model={**CHECKPOINTS, "device": device, "max_context_len": 32, **(model or {})},
        speculative=speculative if speculative is not None else TREE,
        memory={**SMALL_MEMORY, **(memory or {})},
        backend=backend or {},
    )


@pytest.mark.parametrize(
    ("name", "expected"), [("torch", TorchRowMover), ("triton", TritonRowMover)]
)
def test_the_kv_move_setting_picks_the_mover(name: str, expected: type) -> None:
    container = build_container(settings(backend={"kv_move": name}))
    assert type(container.kv_mover()) is expected


@pytest.mark.parametrize(
    ("kind", "expected"), [("mha", MHAKVPool), ("mla", MLAKVPool), ("dsa", DSAKVPool)]
)
def test_the_target_attention_kind_picks_the_kv_pool(
    kind: str, expected: type, device: str
) -> None:
    target = TargetDescription(attention_kind=kind, num_layers=3)  # type: ignore[arg-type]
    pool = build_container(settings(device), target).kv_pool()
    geometry = pool.geometry
    assert (geometry.size, geometry.layer_num, geometry.page_size) == (64, 3, 1)
    assert geometry.device.type == device
    assert geometry.dtype == (torch.bfloat16 if device == "cuda" else torch.float32)  # "auto"
    assert type(pool) is expected


@pytest.mark.parametrize(
    ("name", "expected"), [("torch", TorchAttentionBackend), ("triton", TritonAttentionBackend)]
)
def test_the_attention_setting_picks_the_backend(name: str, expected: type) -> None:
    container = build_container(settings(backend={"attention": name}))
    assert type(container.attention_backend()) is expected


def test_flash_attention_is_built_by_its_factory_when_installed() -> None:
    pytest.importorskip("flash_attn")
    if not torch.cuda.is_available():
        pytest.skip("FlashAttention needs CUDA")
    from eagletree.adapters.attention.flash_backend import FlashAttentionBackend

    container = build_container(settings("cuda", backend={"attention": "flash"}))
    assert type(container.attention_backend()) is FlashAttentionBackend


def test_flash_attention_without_its_package_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # None in sys.modules makes the import inside the factory fail as if not installed.
    monkeypatch.setitem(sys.modules, "eagletree.adapters.attention.flash_backend", None)
    # the platform check refuses flash on the CPU before the factory runs; skip it here
    monkeypatch.setattr(container_module, "resolve_platform", lambda settings: settings)
    flash = settings(
        model={"dtype": "bfloat16"}, backend={"attention": "flash", "kv_move": "torch"}
    )
    container = build_container(flash)
    with pytest.raises(ConfigurationError, match=r"pip install 'eagletree\[flash\]'"):
        container.attention_backend()


def test_the_slot_allocator_and_request_table_are_sized_from_the_settings(device: str) -> None:
    container = build_container(settings(device))
    allocator = container.slot_allocator()
    assert type(allocator) is DeviceSlotAllocator
    assert allocator.size == 64
    table = container.req_to_token_pool()
    assert type(table) is TensorReqToTokenPool
    resolved = container.speculative()
    width = req_to_token_row_width(32, resolved, page_size=1)
    # one row per running request and the padding row of CUDA-graph batches
    assert table.req_to_token.shape == (4 + 1, width)
    assert table.req_to_token.device.type == device


def test_the_settings_dtype_reaches_the_pool() -> None:
    container = build_container(settings(model={"dtype": "float32"}))
    assert container.kv_pool().geometry.dtype == torch.float32


def test_the_page_size_reaches_the_pool() -> None:
    container = build_container(settings(memory={"page_size": 4}))
    assert container.kv_pool().geometry.page_size == 4
    assert container.worker_name() == "eagle_v1"


@pytest.mark.parametrize(
    ("speculative", "target", "worker"),
    [
        ({"algorithm": "none"}, TargetDescription(), "none"),
        (TREE, TargetDescription(), "eagle_v2"),
        ({**TREE, "version": "v1"}, TargetDescription(), "eagle_v1"),
        (
            {"algorithm": "mtp", "num_steps": 2, "eagle_topk": 1, "num_draft_tokens": 3},
            TargetDescription(architecture="MiMoForCausalLM", num_mtp_layers=2),
            "multi_layer_eagle_v2",
        ),
    ],
)
def test_the_resolved_speculation_names_the_worker(
    speculative: dict[str, Any], target: TargetDescription, worker: str
) -> None:
    container = build_container(settings(speculative=speculative), target)
    assert container.worker_name() == worker
    assert container.speculative() == resolve_speculative(settings(speculative=speculative), target)
    assert container.target() is target


def test_pools_and_backends_are_singletons() -> None:
    container = build_container(settings(backend={"attention": "torch"}))
    assert container.kv_pool() is container.kv_pool()
    assert container.slot_allocator() is container.slot_allocator()
    assert container.attention_backend() is container.attention_backend()


class RecordingMover:
    """A RowMover fake that records each call and moves nothing."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, list[int], list[int]]] = []

    def move(
        self,
        buffers: Sequence[torch.Tensor],
        tgt: torch.Tensor,
        src: torch.Tensor,
        *,
        independent_groups: int | None = None,
    ) -> None:
        self.calls.append((len(buffers), tgt.tolist(), src.tolist()))


def test_a_test_can_swap_the_mover_under_the_pool() -> None:
    container = build_container(settings())
    mover = RecordingMover()
    with container.kv_mover.override(providers.Object(mover)):
        pool = container.kv_pool()
    pool.move_kv_cache(torch.tensor([5, 6]), torch.tensor([9, 10]))
    assert [(tgt, src) for _, tgt, src in mover.calls] == [([5, 6], [9, 10])]


def test_a_test_can_swap_a_provider_for_a_fake() -> None:
    container = build_container(settings())
    fake = object()
    with container.slot_allocator.override(providers.Object(fake)):
        assert container.slot_allocator() is fake
    assert type(container.slot_allocator()) is DeviceSlotAllocator


def test_the_environment_reaches_the_selectors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EAGLETREE_BACKEND__KV_MOVE", "torch")
    monkeypatch.setenv("EAGLETREE_MODEL__DEVICE", "cpu")
    monkeypatch.setenv("EAGLETREE_MEMORY__MAX_TOTAL_TOKENS", "16")
    container = build_container()
    assert type(container.kv_mover()) is TorchRowMover
    assert container.slot_allocator().size == 16
    assert container.worker_name() == "none"


def test_a_contradiction_stops_the_build() -> None:
    with pytest.raises(ConfigurationError, match=r"speculative\.version = 'v2' cannot run"):
        build_container(settings(speculative={**TREE, "version": "v2"}, memory={"page_size": 4}))


def test_an_unfilled_container_refuses_to_build() -> None:
    container = Container(
        target=providers.Object(TargetDescription()),
        speculative=providers.Object(resolve_speculative(EngineSettings(), TargetDescription())),
    )
    with pytest.raises(errors.Error, match="Undefined configuration option"):
        container.kv_pool()


def test_the_context_length_defaults_to_the_target_limit() -> None:
    target = TargetDescription(max_position_embeddings=100)
    container = build_container(settings(model={"max_context_len": None}), target)
    resolved = container.speculative()
    width = container.req_to_token_pool().req_to_token.shape[1]
    assert width == req_to_token_row_width(100, resolved, page_size=1)


def resolved_with(steps: int, topk: int, tokens: int) -> ResolvedSpeculative:
    spec = {"algorithm": "eagle", "num_steps": steps, "eagle_topk": topk}
    return resolve_speculative(
        settings(speculative={**spec, "num_draft_tokens": tokens}), TargetDescription()
    )


@pytest.mark.parametrize(
    ("steps", "topk", "tokens", "page_size", "per_step"),
    [
        (3, 4, 8, 1, 12),  # the draft's S·k slots exceed the tree
        (2, 2, 5, 1, 5),  # the tree exceeds S·k
        (3, 1, 4, 1, 4),  # a chain: N = S + 1
        (3, 4, 8, 4, 32),  # paged tree: ceil((4 - 1 + 3) / 4) = 2 pages of 4 for each of 4 branches
        (3, 1, 4, 4, 4),  # paged chain: no per-branch padding
    ],
)
def test_a_decode_step_claims_the_upstream_slot_count(
    steps: int, topk: int, tokens: int, page_size: int, per_step: int
) -> None:
    resolved = resolved_with(steps, topk, tokens)
    assert tokens_allocated_per_step(resolved, page_size) == per_step
    assert req_to_token_row_width(32, resolved, page_size) == 32 + 2 * per_step + ROW_HEADROOM


def test_without_speculation_a_step_claims_one_slot() -> None:
    resolved = resolve_speculative(EngineSettings(), TargetDescription())
    assert tokens_allocated_per_step(resolved, page_size=1) == 1


def test_dtype_names_convert_and_unknown_ones_are_rejected() -> None:
    assert factories.torch_dtype("float16") is torch.float16
    with pytest.raises(ConfigurationError, match=r"model\.dtype = 'fp8': allowed values are"):
        factories.torch_dtype("fp8")


def test_an_unselected_backend_is_never_built(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "eagletree.adapters.attention.flash_backend", None)
    container = build_container(settings(backend={"attention": "torch"}))
    assert type(container.attention_backend()) is TorchAttentionBackend


# -- the engine, end to end through the container --------------------------------------------

PROMPTS = [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10, 11]]


class RecordingRowMover:
    """A RowMover that records each call's buffer and move counts and delegates the move."""

    def __init__(self, inner: TorchRowMover) -> None:
        self.inner = inner
        self.calls: list[tuple[int, int]] = []

    def move(
        self,
        buffers: Sequence[torch.Tensor],
        tgt: torch.Tensor,
        src: torch.Tensor,
        *,
        independent_groups: int | None = None,
    ) -> None:
        self.calls.append((len(buffers), tgt.numel()))
        self.inner.move(buffers, tgt, src, independent_groups=independent_groups)


@pytest.fixture(scope="module")
def tree_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    target, draft = write_random_checkpoint(
        tmp_path_factory.mktemp("checkpoint"),
        "llama",
        "eagle",
        sizes=SIZES,
        dtype=torch.float32,
        std=WEIGHT_STD,
    )
    assert draft is not None
    return str(target), str(draft)


def checkpoint_settings(paths: tuple[str, str], *, speculative: bool) -> EngineSettings:
    target, draft = paths
    model = {"target_path": target, "device": "cpu", "dtype": "float32"}
    return EngineSettings(
        model={**model, "draft_path": draft} if speculative else model,
        speculative=TREE if speculative else {},
        memory={"max_total_tokens": 512, "max_running_requests": 4},
        backend={"attention": "torch", "kv_move": "torch"},
    )


def test_an_overridden_mover_moves_the_kv_rows_of_every_speculative_step(
    tree_checkpoint: tuple[str, str],
) -> None:
    plain = build_engine_container(checkpoint_settings(tree_checkpoint, speculative=False))
    expected = [r.output_ids for r in plain.engine().generate(PROMPTS, max_new_tokens=6)]
    container = build_engine_container(checkpoint_settings(tree_checkpoint, speculative=True))
    mover = RecordingRowMover(TorchRowMover())
    container.kv_mover.override(providers.Object(mover))
    engine = container.engine()
    results = engine.generate(PROMPTS, max_new_tokens=6)
    assert [r.output_ids for r in results] == expected  # the delegated moves kept it lossless
    assert type(container.worker()) is EagleWorkerV2
    assert engine.scheduler is container.scheduler()
    # one compaction per decode step, over the target pool's K and V buffers of every layer
    assert len(mover.calls) >= 6 - 1
    assert {buffers for buffers, _ in mover.calls} == {2 * SIZES.num_layers}
    [draft] = container.draft_runners()
    assert draft.kv_pool is not container.kv_pool()
    assert draft.req_to_token_pool is container.req_to_token_pool()


def test_debug_checks_reach_the_allocator_the_pools_and_the_mover() -> None:
    for debug in (False, True):
        container = build_container(settings(memory={"debug_checks": debug}))
        for provider in (
            container.slot_allocator,
            container.mha_kv_pool,
            container.mla_kv_pool,
            container.dsa_kv_pool,
            *container.kv_mover.providers.values(),
        ):
            assert isinstance(provider, providers.Singleton | providers.Factory)
            assert provider.kwargs["debug_checks"]() is debug


@pytest.mark.gpu
def test_debug_checks_turn_the_range_checks_on_on_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    for debug in (False, True):
        container = build_container(settings("cuda", memory={"debug_checks": debug}))
        assert container.kv_pool().checks_enabled is debug


def test_importing_the_engine_loads_no_container_and_no_adapter() -> None:
    code = (
        "import sys, eagletree.app.engine.loop\n"
        "names = ('eagletree.adapters', 'eagletree.app.composition', 'dependency_injector')\n"
        "print(sorted(m for m in sys.modules if m.startswith(names)))\n"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert loaded.strip() == "[]"
