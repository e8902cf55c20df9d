"""The Triton backend's kernel phases and options against the reference: split key
ranges, long prefixes with wide trees, every tile option (and the refusal of bad
tiles), and logit capping."""

from __future__ import annotations

import pytest
import torch

from eagletree.adapters.attention.triton_backend import TritonAttentionBackend
from eagletree.domain.batch import ForwardMode
from tests.contracts.attention.backends import (
    CPU_SHAPES,
    MODES,
    TOLERANCE,
    backend_factory,
    random_twins,
    reference_output,
    run,
)
from tests.contracts.attention.cases import Shape, make_case


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
@pytest.mark.parametrize("shape_name", ["gqa-r4-d64", "mla-32+16"])
@pytest.mark.parametrize("min_chunk", [None, 16, 96], ids=lambda c: f"min_chunk={c}")
def test_triton_split_key_ranges_merge_to_the_reference(
    mode: ForwardMode, shape_name: str, min_chunk: int | None, device: torch.device
) -> None:
    # target_programs far above the grid forces several splits of every request's keys; a
    # large min_chunk leaves some splits without keys, a small one gives every split a block
    chunk = {} if min_chunk is None else {"min_chunk": min_chunk}
    factory = backend_factory("triton", device, target_programs=4096, max_kv_splits=3, **chunk)
    case, expected = random_twins(mode, CPU_SHAPES[shape_name], device, torch.float32, 11, bs=3)
    torch.testing.assert_close(run(factory(case), case).float(), expected, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize(
    ("mode", "block_n", "split"),
    [(mode, 64, True) for mode in MODES] + [(ForwardMode.TARGET_VERIFY, 32, False)],
    ids=lambda v: v.name if isinstance(v, ForwardMode) else str(v),
)
def test_triton_long_prefixes_and_wide_trees_match_the_reference(
    mode: ForwardMode, block_n: int, split: bool, device: torch.device
) -> None:
    # prefixes of whole key blocks, a ragged end and none, so every kernel phase runs (unmasked
    # prefix blocks, the prefix's ragged end, tail blocks); N = 40 needs two bit words per node,
    # and with 64-key blocks one tail block spans both; splits cut through prefix and tail
    options = {"block_n": block_n} | (
        {"target_programs": 4096, "max_kv_splits": 3} if split else {}
    )
    factory = backend_factory("triton", device, **options)
    extra: dict[str, object] = {"num_draft_tokens": 40, "topk": 4, "depth": 3}
    if mode is ForwardMode.EXTEND:
        extra["extend_lens"] = [3, 40, 0, 17]
    shape = Shape(4, 2, 16, 16)
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    twins = [
        make_case(mode, shape, [64, 77, 5, 0], device=device, dtype=dtype, seed=71, **extra)  # type: ignore[arg-type]
        for _ in range(2)
    ]
    expected = reference_output(twins[1])
    atol, rtol = TOLERANCE[dtype]
    torch.testing.assert_close(
        run(factory(twins[0]), twins[0]).float(), expected, atol=atol, rtol=rtol
    )


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"block_m": 16},
        {"block_m": 64},
        {"block_m": 128},
        {"block_n": 64, "num_stages": 2},
        {"max_registers": 0},
    ],
    ids=["default", "m16", "m64", "m128", "n64-s2", "no-register-cap"],
)
@pytest.mark.parametrize("mode", [ForwardMode.EXTEND, ForwardMode.TARGET_VERIFY], ids=str)
def test_triton_tile_options_give_the_same_attention(
    options: dict[str, int], mode: ForwardMode, device: torch.device
) -> None:
    # the benchmark's tune sweep changes these; every choice must compute the same attention
    if device.type == "cpu" and set(options) - {"block_m", "block_n"}:
        pytest.skip("the interpreter ignores warps, stages and register caps")
    factory = backend_factory("triton", device, **options)
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    # group 8 × N 32 = 256 rows per request: on the GPU the default is one 256-row tile
    case, expected = random_twins(
        mode, Shape(16, 2, 64, 64), device, dtype, 81, bs=2, num_draft_tokens=32, topk=4, depth=2
    )
    atol, rtol = TOLERANCE[dtype]
    torch.testing.assert_close(run(factory(case), case).float(), expected, atol=atol, rtol=rtol)


@pytest.mark.parametrize("options", [{"block_n": 48}, {"block_m": 8}], ids=["n48", "m8"])
def test_triton_refuses_tile_sizes_that_are_not_powers_of_two_from_16(
    options: dict[str, int],
) -> None:
    case = make_case(
        ForwardMode.DECODE, Shape(4, 2, 64, 64), [2], device="cpu", dtype=torch.float32, seed=0
    )
    with pytest.raises(ValueError, match="power of two"):
        TritonAttentionBackend(case.pool, case.req_to_token, **options)


@pytest.mark.parametrize("mode", [ForwardMode.DECODE, ForwardMode.TARGET_VERIFY], ids=str)
def test_triton_caps_logits_like_the_reference(mode: ForwardMode, device: torch.device) -> None:
    factory = backend_factory("triton", device)
    shape = Shape(4, 2, 64, 64)
    case, expected = random_twins(mode, shape, device, torch.float32, 41, bs=3, logit_cap=2.0)
    _, uncapped = random_twins(mode, shape, device, torch.float32, 41, bs=3)
    assert not torch.allclose(uncapped, expected, atol=1e-3)  # the cap matters in this case
    torch.testing.assert_close(run(factory(case), case).float(), expected, atol=2e-5, rtol=2e-5)
