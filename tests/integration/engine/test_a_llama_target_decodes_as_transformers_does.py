"""A Llama target against transformers: the engine's greedy output equals
``generate``, under retraction too, and through build_engine's container."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from eagletree.app.composition.container import build_engine
from eagletree.app.engine.loop import Engine
from tests.fakes import plain_engine

HF_CONFIGS: dict[str, dict[str, Any]] = {
    "gqa-untied": {"num_attention_heads": 4, "num_key_value_heads": 2, "tie": False},
    "mha-tied": {"num_attention_heads": 4, "num_key_value_heads": 4, "tie": True},
}


@pytest.fixture(scope="module", params=list(HF_CONFIGS))
def hf_checkpoint(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Any, Path]:
    """A random tiny HF Llama (fp32) saved with save_pretrained, and the HF model itself."""
    transformers = pytest.importorskip("transformers")
    shape: dict[str, Any] = HF_CONFIGS[request.param]
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=112,
        num_hidden_layers=2,
        num_attention_heads=shape["num_attention_heads"],
        num_key_value_heads=shape["num_key_value_heads"],
        max_position_embeddings=128,
        tie_word_embeddings=shape["tie"],
        rope_theta=500.0,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    path = tmp_path_factory.mktemp(f"llama-{request.param}")
    model.save_pretrained(path)
    return model, path


def llama_engine(
    path: Path, pool_size: int = 512, max_running: int = 4, device: torch.device | str = "cpu"
) -> Engine:
    from eagletree.adapters.attention.torch_backend import TorchAttentionBackend
    from eagletree.adapters.memory.mha_pool import MHAKVPool
    from eagletree.adapters.memory.req_to_token import TensorReqToTokenPool
    from eagletree.adapters.memory.row_movers import TorchRowMover
    from eagletree.adapters.memory.slot_allocator import DeviceSlotAllocator
    from eagletree.adapters.models.loading import load_target
    from eagletree.adapters.models.runner import TargetModelRunner
    from eagletree.adapters.models.stack import MHALayout

    model = load_target(path, torch.float32, device)
    layout = model.kv_layout
    assert isinstance(layout, MHALayout)
    kv_pool = MHAKVPool(
        size=pool_size,
        layer_num=layout.layer_num,
        kv_heads=layout.kv_heads,
        head_dim=layout.head_dim,
        v_head_dim=layout.v_head_dim,
        dtype=torch.float32,
        device=device,
        mover=TorchRowMover(),
    )
    table = TensorReqToTokenPool(max_running, 128 + 8, device)
    runner = TargetModelRunner(model, kv_pool, table, TorchAttentionBackend(kv_pool, table))
    return plain_engine(
        runner,
        DeviceSlotAllocator(pool_size, device),
        max_context_len=128,
        max_running_requests=max_running,
    )


def hf_greedy(model: Any, prompt: list[int], max_new_tokens: int) -> list[int]:
    ids = torch.tensor([prompt])
    output = model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False
    )
    tokens: list[int] = output[0, len(prompt) :].tolist()
    return tokens


def ragged_prompts(batch_size: int, seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    lengths = [1, 9, 4, 15][:batch_size]
    return [torch.randint(0, 96, (n,), generator=generator).tolist() for n in lengths]


@pytest.mark.hf
@pytest.mark.parametrize("batch_size", [1, 2, 3, 4])
def test_engine_greedy_output_equals_transformers_generate(
    hf_checkpoint: tuple[Any, Path], batch_size: int, device: torch.device
) -> None:
    hf_model, path = hf_checkpoint
    prompts = ragged_prompts(batch_size, seed=batch_size)
    results = llama_engine(path, device=device).generate(prompts, max_new_tokens=10)
    for prompt, result in zip(prompts, results, strict=True):
        assert result.output_ids == hf_greedy(hf_model, prompt, 10)


@pytest.mark.hf
def test_llama_retract_under_a_tight_pool_keeps_the_transformers_output(
    hf_checkpoint: tuple[Any, Path],
) -> None:
    hf_model, path = hf_checkpoint
    prompts = ragged_prompts(4, seed=11)
    engine = llama_engine(path, pool_size=48)  # 4 requests grow to 1+9+4+15 + 4·10 = 69 tokens
    results = engine.generate(prompts, max_new_tokens=10)
    assert engine.stats.num_retracted > 0
    for prompt, result in zip(prompts, results, strict=True):
        assert result.output_ids == hf_greedy(hf_model, prompt, 10)
    assert engine.scheduler.allocator.available_size() == 48


@pytest.mark.hf
def test_build_engine_wires_the_checkpoint_through_the_container(
    hf_checkpoint: tuple[Any, Path], device: torch.device
) -> None:
    pytest.importorskip("pydantic_settings")
    pytest.importorskip("dependency_injector")
    from eagletree.config.settings import EngineSettings

    hf_model, path = hf_checkpoint
    settings = EngineSettings(
        model={"target_path": str(path), "device": str(device), "dtype": "float32"},
        backend={"attention": "torch", "kv_move": "torch"},
        memory={"max_total_tokens": 256, "max_running_requests": 2},
    )
    engine = build_engine(settings)
    assert engine.max_context_len == 128  # the checkpoint's max_position_embeddings
    assert engine.eos_token_ids == frozenset()
    prompts = ragged_prompts(3, seed=5)
    results = engine.generate(prompts, max_new_tokens=6)
    for prompt, result in zip(prompts, results, strict=True):
        assert result.output_ids == hf_greedy(hf_model, prompt, 6)
