"""The container's providers: pools and backends are singletons, an unfilled
container refuses to build, and an overridden provider (a recording mover, a fake) is
what the engine runs end to end."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch
from dependency_injector import errors, providers

from eagletree.adapters.memory.row_movers import TorchRowMover
from eagletree.adapters.memory.slot_allocator import DeviceSlotAllocator
from eagletree.adapters.models.random_checkpoint import write_random_checkpoint
from eagletree.app.composition.container import Container, build_container, build_engine_container
from eagletree.app.workers.eagle_v2 import EagleWorkerV2
from eagletree.config.eagle_hook import resolve_speculative
from eagletree.config.settings import EngineSettings
from eagletree.config.target import TargetDescription
from tests.integration.container.small_settings import TREE, settings
from tests.integration.spec.harness import SIZES, WEIGHT_STD


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


def test_an_unfilled_container_refuses_to_build() -> None:
    container = Container(
        target=providers.Object(TargetDescription()),
        speculative=providers.Object(resolve_speculative(EngineSettings(), TargetDescription())),
    )
    with pytest.raises(errors.Error, match="Undefined configuration option"):
        container.kv_pool()


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
