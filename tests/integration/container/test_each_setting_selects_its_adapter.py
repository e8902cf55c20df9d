"""The composition root selects by setting: the KV mover, the pool of the target's
attention kind, the attention backend (FlashAttention only when installed, and never
an unselected one), the worker of the resolved speculation, from files and the
environment; a contradiction stops the build."""

from __future__ import annotations

import sys
from typing import Any

import pytest
import torch

from eagletree.adapters.attention.torch_backend import TorchAttentionBackend
from eagletree.adapters.attention.triton_backend import TritonAttentionBackend
from eagletree.adapters.memory.dsa_pool import DSAKVPool
from eagletree.adapters.memory.mha_pool import MHAKVPool
from eagletree.adapters.memory.mla_pool import MLAKVPool
from eagletree.adapters.memory.row_movers import TorchRowMover, TritonRowMover
from eagletree.app.composition import container as container_module
from eagletree.app.composition.container import build_container
from eagletree.config.eagle_hook import resolve_speculative
from eagletree.config.target import TargetDescription
from eagletree.domain.errors import ConfigurationError
from tests.integration.container.small_settings import TREE, settings


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


def test_an_unselected_backend_is_never_built(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "eagletree.adapters.attention.flash_backend", None)
    container = build_container(settings(backend={"attention": "torch"}))
    assert type(container.attention_backend()) is TorchAttentionBackend
