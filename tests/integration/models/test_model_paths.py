"""A model's path is fixed when it is built: a model built with fused kernels never runs a
torch reference block and stores its own KV; a model built without never launches a Triton
kernel and lets the backend store; folded layers run a decode step on the residual stream and
only a prefill past the weight-stream limit through their norms; a pool the fused layers cannot
write is refused when the runner is built, not worked around per call.

Each route a model must not take is replaced, before the model is built, by one that fails.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch import nn

from eagletree.adapters.attention.torch_backend import TorchAttentionBackend
from eagletree.adapters.kernels.triton.rmsnorm import fused_add_rmsnorm
from eagletree.adapters.kernels.triton.skinny_gemm import skinny_gemm
from eagletree.adapters.memory.mha_pool import MHAKVPool
from eagletree.adapters.memory.req_to_token import TensorReqToTokenPool
from eagletree.adapters.memory.row_movers import TorchRowMover
from eagletree.adapters.models import (
    deepseek_mla,
    layers,
    llama_attention,
    rotary,
    streamed_linear,
)
from eagletree.adapters.models.config import LlamaConfig, MLAConfig, RopeConfig
from eagletree.adapters.models.deepseek_mla import DeepseekMLAForCausalLM
from eagletree.adapters.models.layers import RMSNorm
from eagletree.adapters.models.llama import (
    LlamaDecoderLayer,
    LlamaForCausalLM,
    StreamLlamaDecoderLayer,
)
from eagletree.adapters.models.rotary import RopeTables
from eagletree.adapters.models.runner import TargetModelRunner
from eagletree.domain.attention_layer import AttentionLayer
from eagletree.domain.batch import ForwardBatch
from eagletree.ports.attention import AttentionBackend
from tests.conftest import requires_triton
from tests.integration.models.harness import (
    Memory,
    Requests,
    make_backend,
    make_pool,
    perturb_parameters,
    random_prompts,
)

LLAMA = LlamaConfig(
    vocab_size=64,
    hidden_size=40,
    intermediate_size=56,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=10,
    rms_norm_eps=1e-6,
    rope=RopeConfig(theta=10000.0),
    max_position_embeddings=256,
)
MLA = MLAConfig(
    vocab_size=64,
    hidden_size=40,
    intermediate_size=56,
    num_hidden_layers=2,
    num_attention_heads=3,
    q_lora_rank=24,
    kv_lora_rank=20,
    qk_nope_head_dim=8,
    qk_rope_head_dim=6,
    v_head_dim=10,
    rms_norm_eps=1e-6,
    rope=RopeConfig(theta=10000.0),
    max_position_embeddings=256,
    rope_interleave=True,
)
MODELS: dict[str, Callable[[bool], nn.Module]] = {
    "llama": lambda fused: LlamaForCausalLM(LLAMA, fused_kernels=fused),
    "deepseek-mla": lambda fused: DeepseekMLAForCausalLM(MLA, fused_kernels=fused),
}
Target = LlamaForCausalLM | DeepseekMLAForCausalLM


class RecordingBackend:
    """An attention backend that records, per layer call, whether it was asked to store."""

    def __init__(self, inner: AttentionBackend) -> None:
        self.inner = inner
        self.save_kv: list[bool] = []

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        self.inner.init_forward_metadata(batch)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor | None,
        layer: AttentionLayer,
        batch: ForwardBatch,
        save_kv: bool = True,
    ) -> torch.Tensor:
        self.save_kv.append(save_kv)
        return self.inner.forward(q, k, v, layer, batch, save_kv)


def forbid(monkeypatch: pytest.MonkeyPatch, owner: object, name: str) -> None:
    """``owner.name`` fails when called (set before a model is built, which may keep it)."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"{name} ran")

    monkeypatch.setattr(owner, name, refuse)


def run_steps(model: Target, backend_name: str, prompt_lens: list[int]) -> RecordingBackend:
    """A prefill of ``prompt_lens`` and two decode steps through a runner; the backend's record."""
    memory = Memory(torch.device("cpu"), num_slots=256, row_width=128)
    pool = make_pool(model.kv_layout, memory.allocator.size, torch.float32, memory.device)
    backend = RecordingBackend(make_backend(backend_name, pool, memory.req_to_token_pool))
    runner = TargetModelRunner(model, pool, memory.req_to_token_pool, backend)
    requests = Requests(memory, len(prompt_lens))
    runner.forward(requests.extend(random_prompts(LLAMA.vocab_size, prompt_lens, seed=3)))
    for step in range(2):
        runner.forward(requests.decode([step + 1] * len(prompt_lens)))
    return backend


def built(name: str, fused: bool, fold: bool = False) -> Target:
    model = MODELS[name](fused)
    assert isinstance(model, LlamaForCausalLM | DeepseekMLAForCausalLM)
    perturb_parameters(model, seed=4)
    if fold and isinstance(model, LlamaForCausalLM):
        model.fold_norms()
    return model.eval()


@pytest.mark.parametrize("name", MODELS)
def test_a_model_built_with_fused_kernels_never_runs_a_reference_block(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    requires_triton("cpu")
    for owner, routes in (
        (RopeTables, ["rotate"]),
        (RMSNorm, ["forward", "add", "concat"]),
        (rotary, ["torch_tables"]),
        (layers, ["silu_times_up"]),
    ):
        for route in routes:
            forbid(monkeypatch, owner, route)
    backend = run_steps(built(name, fused=True), "triton", [5, 3])
    assert backend.save_kv and not any(backend.save_kv)  # every layer stored its own rows


@pytest.mark.parametrize("name", MODELS)
def test_a_model_built_without_fused_kernels_never_launches_a_triton_kernel(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    for owner, kernel in (
        (llama_attention, "rope_kv_store"),
        (deepseek_mla, "mla_rope_kv_store"),
        (layers, "rmsnorm"),
        (layers, "fused_add_rmsnorm"),
        (layers, "silu_and_mul"),
        (streamed_linear, "skinny_gemm"),
        (rotary, "rope_tables"),
    ):
        forbid(monkeypatch, owner, kernel)
    backend = run_steps(built(name, fused=False, fold=True), "torch", [5, 3])
    assert backend.save_kv and all(backend.save_kv)  # the backend stored every row


@pytest.fixture
def norm_kernel_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, int]]:
    """How often each norm kernel ran (the fused norms look them up when they run)."""
    calls = {"rmsnorm": 0, "fused_add_rmsnorm": 0}
    for name in calls:
        kernel = getattr(layers, name)

        def counted(*args: Any, name: str = name, kernel: Any = kernel, **kwargs: Any) -> Any:
            calls[name] += 1
            return kernel(*args, **kwargs)

        monkeypatch.setattr(layers, name, counted)
    yield calls


def test_folded_layers_run_a_decode_step_on_the_stream_and_a_long_prefill_through_norms(
    norm_kernel_calls: dict[str, int],
) -> None:
    requires_triton("cpu")
    model = built("llama", fused=True, fold=True)
    assert all(isinstance(layer, StreamLlamaDecoderLayer) for layer in model.layers)
    memory = Memory(torch.device("cpu"), num_slots=256, row_width=128)
    parts = memory.runner_parts(model.kv_layout, "triton", torch.float32)
    runner = TargetModelRunner(model, *parts)
    requests = Requests(memory, 2)
    # 70 rows: more than the weight-stream kernel takes, so every layer runs its norms
    runner.forward(requests.extend(random_prompts(LLAMA.vocab_size, [40, 30], seed=5)))
    assert norm_kernel_calls["fused_add_rmsnorm"] == 2 * LLAMA.num_hidden_layers
    norm_kernel_calls.update(rmsnorm=0, fused_add_rmsnorm=0)
    runner.forward(requests.decode([1, 2]))
    # on the stream: no norm before the final one, which has no residual beside it to add
    assert norm_kernel_calls == {"rmsnorm": 1, "fused_add_rmsnorm": 0}


def test_eagle3_captures_are_stored_by_the_kernels_that_compute_the_streams(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A folded two-layer target capturing the inputs of layers 0, 1 and 2 (the last layer's
    output): on a decode step (stream layers) the down_proj kernels of layers 0 and 1 store
    the last two, on a prefill past the weight-stream limit (pre-norm layers) the add + norm
    kernels of layer 1's input norm and of the final norm do; the embedding is copied. The
    captured states equal the torch reference's."""
    requires_triton("cpu")
    stored: dict[str, list[int]] = {"skinny_gemm": [], "fused_add_rmsnorm": []}

    def spy(owner: object, name: str, kernel: Callable[..., Any]) -> None:
        def counted(*args: Any, copy_to: torch.Tensor | None = None, **kwargs: Any) -> Any:
            if copy_to is not None:
                stored[name].append(copy_to.shape[0])
            return kernel(*args, copy_to=copy_to, **kwargs)

        monkeypatch.setattr(owner, name, counted)

    spy(streamed_linear, "skinny_gemm", skinny_gemm)
    spy(layers, "fused_add_rmsnorm", fused_add_rmsnorm)
    aux_ids = (0, 1, 2)
    model = LlamaForCausalLM(LLAMA, aux_ids, fused_kernels=True)
    reference = LlamaForCausalLM(LLAMA, aux_ids, fused_kernels=False)
    for target in (model, reference):
        perturb_parameters(target, seed=4)
    model.fold_norms()
    outputs = []
    for target in (model.eval(), reference.eval()):
        memory = Memory(torch.device("cpu"), num_slots=256, row_width=128)
        parts = memory.runner_parts(target.kv_layout, "triton", torch.float32)
        runner = TargetModelRunner(target, *parts)
        requests = Requests(memory, 2)
        outputs.append(runner.forward(requests.extend(random_prompts(64, [40, 30], seed=5))))
        if target is model:  # 70 rows: the layers run their norms
            assert stored == {"skinny_gemm": [], "fused_add_rmsnorm": [70, 70]}
        outputs.append(runner.forward(requests.decode([1, 2])))
    assert stored == {"skinny_gemm": [2, 2], "fused_add_rmsnorm": [70, 70]}
    fused_fill, fused_step, reference_fill, reference_step = outputs
    for fused, expected in ((fused_fill, reference_fill), (fused_step, reference_step)):
        assert fused.aux_hidden_states is not None and expected.aux_hidden_states is not None
        assert torch.allclose(fused.aux_hidden_states, expected.aux_hidden_states, atol=1e-4)


def test_fold_norms_gives_the_stream_layer_only_to_layers_built_with_fused_kernels() -> None:
    fused, reference = built("llama", fused=True, fold=True), built("llama", False, fold=True)
    assert all(type(layer) is StreamLlamaDecoderLayer for layer in fused.layers)
    assert all(type(layer) is LlamaDecoderLayer for layer in reference.layers)
    assert all(layer.norms_folded for layer in [*fused.layers, *reference.layers])
    # a projection with a bias keeps its norms (the statistic would scale the bias)
    biased = LlamaForCausalLM(dataclasses.replace(LLAMA, attention_bias=True), fused_kernels=True)
    before = list(biased.layers)
    biased.fold_norms()
    assert list(biased.layers) == before
    assert not any(layer.norms_folded for layer in biased.layers)


def test_a_pool_the_fused_layers_cannot_write_is_refused_when_the_runner_is_built() -> None:
    def runner(model: LlamaForCausalLM) -> TargetModelRunner:
        layout = model.kv_layout
        pool = MHAKVPool(
            16, layout.layer_num, layout.kv_heads, layout.head_dim, layout.v_head_dim,
            torch.bfloat16, "cpu", TorchRowMover(), store_dtype=torch.float8_e4m3fn,
        )  # fmt: skip
        table = TensorReqToTokenPool(2, 16, "cpu")
        return TargetModelRunner(model, pool, table, TorchAttentionBackend(pool, table))

    with pytest.raises(ValueError, match="build the model with fused_kernels=False"):
        runner(LlamaForCausalLM(LLAMA, fused_kernels=True))
    runner(LlamaForCausalLM(LLAMA))  # the backend stores, converting to fp8 itself
