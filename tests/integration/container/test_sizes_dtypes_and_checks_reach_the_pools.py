"""The composition root sizes what it builds from the settings: the slot allocator
and request table, the pool's dtype and page size, the context length, the slots a
decode step claims, and the debug checks."""

from __future__ import annotations

import pytest
import torch
from dependency_injector import providers

from eagletree.adapters.memory.req_to_token import TensorReqToTokenPool
from eagletree.adapters.memory.slot_allocator import DeviceSlotAllocator
from eagletree.app.composition import factories
from eagletree.app.composition.container import build_container
from eagletree.app.composition.sizing import (
    ROW_HEADROOM,
    req_to_token_row_width,
    tokens_allocated_per_step,
)
from eagletree.config.eagle_hook import ResolvedSpeculative, resolve_speculative
from eagletree.config.settings import EngineSettings
from eagletree.config.target import TargetDescription
from eagletree.domain.draft_shape import DraftShape
from eagletree.domain.errors import ConfigurationError
from tests.integration.container.small_settings import settings


def test_the_slot_allocator_and_request_table_are_sized_from_the_settings(device: str) -> None:
    container = build_container(settings(device))
    allocator = container.slot_allocator()
    assert type(allocator) is DeviceSlotAllocator
    assert allocator.size == 64
    table = container.req_to_token_pool()
    assert type(table) is TensorReqToTokenPool
    resolved = container.speculative()
    width = req_to_token_row_width(32, resolved, 1, container.shape_policy().shapes)
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


def test_the_context_length_defaults_to_the_target_limit() -> None:
    target = TargetDescription(max_position_embeddings=100)
    container = build_container(settings(model={"max_context_len": None}), target)
    resolved = container.speculative()
    width = container.req_to_token_pool().req_to_token.shape[1]
    assert width == req_to_token_row_width(100, resolved, 1, container.shape_policy().shapes)


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
    shapes = [DraftShape(steps, topk, tokens)]  # a fixed policy's: the configured shape
    assert (
        req_to_token_row_width(32, resolved, page_size, shapes) == 32 + 2 * per_step + ROW_HEADROOM
    )


def test_without_speculation_a_step_claims_one_slot() -> None:
    resolved = resolve_speculative(EngineSettings(), TargetDescription())
    assert tokens_allocated_per_step(resolved, page_size=1) == 1


def test_dtype_names_convert_and_unknown_ones_are_rejected() -> None:
    assert factories.torch_dtype("float16") is torch.float16
    with pytest.raises(ConfigurationError, match=r"model\.dtype = 'fp8': allowed values are"):
        factories.torch_dtype("fp8")


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
