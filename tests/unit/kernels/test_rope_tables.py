"""rope_tables against RotaryEmbedding's torch path, and the models' rotaries on it when fused.

The tolerance is in units of the last place (ulps, counted across zero), not a relative one:
fp32 cos/sin within 4 ulps of torch's (the two libms differ by an ulp or two, and the attention
factor's multiply can add one more rounding); bf16/fp16 tables equal to torch's or one ulp
apart (a pre-cast difference of an ulp can flip a rounding, and the CPU interpreter truncates
its bf16 casts). That fails on a dropped attention factor (9 % and more here), on swapped
columns or cos for sin, and on an approximate cos/sin: positions go up to 131072 and the first
column's frequency is about 1, so its angle is the position itself.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from eagletree.adapters.kernels.triton.rope_tables import rope_tables
from eagletree.adapters.models.config import LlamaConfig, MLAConfig, RopeConfig
from eagletree.adapters.models.deepseek_mla import DeepseekMLAForCausalLM
from eagletree.adapters.models.eagle import EagleDraft, SharedTargetModules
from eagletree.adapters.models.eagle3 import Eagle3Draft
from eagletree.adapters.models.llama import LlamaForCausalLM
from eagletree.adapters.models.model_building import materialize
from eagletree.adapters.models.mtp import MTPLayer
from eagletree.adapters.models.rotary import RopeTables, RotaryEmbedding
from tests.conftest import requires_triton

MAX_POSITION = 131072

# every scaling rotary.py supports; both YaRN cases have an attention factor other than 1
ROPES = {
    "default": RopeConfig(theta=10000.0),
    "linear": RopeConfig(theta=10000.0, rope_type="linear", factor=4.0),
    "llama3": RopeConfig(
        theta=500000.0,
        rope_type="llama3",
        factor=8.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=8192,
    ),
    "yarn-mscale": RopeConfig(  # the factor: the ratio of two mscales, 1.086
        theta=10000.0,
        rope_type="yarn",
        factor=40.0,
        original_max_position_embeddings=4096,
        mscale=1.0,
        mscale_all_dim=0.707,
    ),
    "yarn-given-factor": RopeConfig(
        theta=10000.0,
        rope_type="yarn",
        factor=4.0,
        original_max_position_embeddings=64,
        attention_factor=0.8,
    ),
}
MAX_ULPS = {torch.float32: 4, torch.bfloat16: 1, torch.float16: 1}


def ordered(t: torch.Tensor) -> torch.Tensor:
    """Each float's bit pattern as an integer that counts ulps from zero (negative below)."""
    bits = t.view(torch.int32 if t.element_size() == 4 else torch.int16).long()
    magnitude = bits & ((1 << (8 * t.element_size() - 1)) - 1)
    return torch.where(bits < 0, -magnitude, magnitude)


def assert_tables_close(ours: RopeTables, reference: RopeTables) -> None:
    assert ours.interleaved == reference.interleaved
    for table, want in ((ours.cos, reference.cos), (ours.sin, reference.sin)):
        assert table.dtype == want.dtype and table.shape == want.shape
        assert table.stride() == want.stride()  # rows of dim columns, what the fused kernels read
        if table.numel():
            ulps = (ordered(table) - ordered(want)).abs().max().item()
            assert ulps <= MAX_ULPS[want.dtype], f"{ulps} ulps apart"


def random_positions(num_tokens: int, device: torch.device, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    positions = torch.randint(0, MAX_POSITION, (num_tokens,), generator=generator)
    if num_tokens:
        positions[-1] = MAX_POSITION - 1  # the largest angle, whatever the draw
    return positions.to(device)


@pytest.mark.parametrize("rope", ROPES.values(), ids=ROPES.keys())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("num_tokens", [0, 1, 37])  # 37: two blocks of 16 rows and a ragged one
@pytest.mark.parametrize("dim", [64, 24])  # 24: a 32-wide block with masked columns
@pytest.mark.parametrize("interleaved", [False, True], ids=["half-split", "interleaved"])
def test_fused_tables_are_the_torch_paths_to_an_ulp(
    device: torch.device,
    rope: RopeConfig,
    dtype: torch.dtype,
    num_tokens: int,
    dim: int,
    interleaved: bool,
) -> None:
    requires_triton(device)
    positions = random_positions(num_tokens, device, seed=num_tokens + dim)
    reference = RotaryEmbedding(rope, dim, interleaved).to(device)
    fused = RotaryEmbedding(rope, dim, interleaved, fused_kernels=True).to(device)
    assert_tables_close(fused(positions, dtype), reference(positions, dtype))


def test_the_kernel_refuses_float_positions_and_non_fp32_frequencies() -> None:
    freq = torch.ones(8)
    with pytest.raises(ValueError, match="integer positions"):
        rope_tables(torch.zeros(3), freq, 1.0, torch.float32)
    with pytest.raises(ValueError, match="fp32 column frequencies"):
        rope_tables(torch.zeros(3, dtype=torch.int64), freq.half(), 1.0, torch.float32)


LLAMA = LlamaConfig(
    vocab_size=64,
    hidden_size=40,
    intermediate_size=56,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=10,
    rms_norm_eps=1e-6,
    rope=ROPES["llama3"],
    max_position_embeddings=MAX_POSITION,
)
MLA = MLAConfig(
    vocab_size=64,
    hidden_size=40,
    intermediate_size=56,
    num_hidden_layers=1,
    num_attention_heads=3,
    q_lora_rank=24,
    kv_lora_rank=20,
    qk_nope_head_dim=8,
    qk_rope_head_dim=6,
    v_head_dim=10,
    rms_norm_eps=1e-6,
    rope=ROPES["yarn-mscale"],
    max_position_embeddings=MAX_POSITION,
    rope_interleave=True,
)


def shared() -> SharedTargetModules:
    target = LlamaForCausalLM(LLAMA)
    return SharedTargetModules(target.embed_tokens, target.lm_head)


# every model that owns a RotaryEmbedding, built with the given fused_kernels
MODELS: dict[str, Callable[[bool], nn.Module]] = {
    "llama": lambda fused: LlamaForCausalLM(LLAMA, fused_kernels=fused),
    "deepseek-mla": lambda fused: DeepseekMLAForCausalLM(MLA, fused_kernels=fused),
    "eagle": lambda fused: EagleDraft(LLAMA, shared(), fc_bias=True, fused_kernels=fused),
    "eagle3": lambda fused: Eagle3Draft(LLAMA, shared(), 48, 24, fused_kernels=fused),
    "mtp-llama": lambda fused: MTPLayer(LLAMA, shared(), fused_kernels=fused),
    "mtp-mla": lambda fused: MTPLayer(MLA, shared(), fused_kernels=fused),
}


def rotary_of(model: nn.Module) -> RotaryEmbedding:
    (rotary,) = (m for m in model.modules() if isinstance(m, RotaryEmbedding))
    return rotary


@pytest.mark.parametrize("build", MODELS.values(), ids=MODELS.keys())
@pytest.mark.parametrize("fused", [True, False])
def test_a_models_rotary_is_fused_when_the_model_is(
    build: Callable[[bool], nn.Module], fused: bool
) -> None:
    assert rotary_of(build(fused)).fused_kernels is fused


@pytest.mark.parametrize("name", ["llama", "deepseek-mla"])
def test_a_fused_target_built_on_meta_gives_the_torch_paths_tables(
    device: torch.device, name: str
) -> None:
    # built as the loaders build it: on the meta device, allocated in bf16, then
    # reset_parameters recomputes the fp32 frequencies the kernel reads
    requires_triton(device)
    rotary = rotary_of(materialize(lambda: MODELS[name](True), torch.bfloat16, device))
    assert rotary.fused_kernels and rotary.column_freq.dtype == torch.float32
    reference = RotaryEmbedding(rotary.rope, rotary.dim, rotary.interleaved).to(device)
    positions = random_positions(37, device, seed=5)
    assert_tables_close(rotary(positions, torch.bfloat16), reference(positions, torch.bfloat16))
