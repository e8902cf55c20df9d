"""What the attention backends refuse: FlashAttention off CUDA, on too wide heads or
with logit capping, and a forward without metadata for its batch."""

from __future__ import annotations

import pytest
import torch

from eagletree.adapters.attention.flash_backend import FlashAttentionBackend
from eagletree.adapters.attention.torch_backend import TorchAttentionBackend
from eagletree.domain.batch import ForwardMode
from tests.contracts.attention.backends import GPU_SHAPES, run
from tests.contracts.attention.cases import Shape, make_case


def test_flash_backend_refuses_what_it_cannot_run(device: torch.device) -> None:
    if device.type != "cuda":
        case = make_case(
            ForwardMode.DECODE, Shape(4, 2, 64, 64), [2], device=device, dtype=torch.float16, seed=0
        )
        with pytest.raises(RuntimeError, match="needs a CUDA device"):
            FlashAttentionBackend(case.pool, case.req_to_token)
        return
    wide = make_case(
        ForwardMode.DECODE,
        GPU_SHAPES["mla-512+64"],
        [2],
        device=device,
        dtype=torch.bfloat16,
        seed=0,
    )
    with pytest.raises(ValueError, match="TritonAttentionBackend"):
        FlashAttentionBackend(wide.pool, wide.req_to_token)
    capped = make_case(
        ForwardMode.DECODE,
        Shape(4, 2, 64, 64),
        [2],
        device=device,
        dtype=torch.bfloat16,
        seed=0,
        logit_cap=5.0,
    )
    with pytest.raises(NotImplementedError, match="logit capping"):
        run(FlashAttentionBackend(capped.pool, capped.req_to_token), capped)


def test_forward_without_metadata_for_the_batch_is_an_error(device: torch.device) -> None:
    case = make_case(
        ForwardMode.DECODE, Shape(4, 2, 64, 64), [2], device=device, dtype=torch.float32, seed=0
    )
    backend = TorchAttentionBackend(case.pool, case.req_to_token)
    with pytest.raises(RuntimeError, match="init_forward_metadata"):
        backend.forward(case.q, case.k, case.v, case.layer, case.batch)
