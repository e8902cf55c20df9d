"""GPU, slow: a random checkpoint of Llama-3.1-8B dimensions with an EAGLE-3 head, in bf16.

Proves what the tiny parity tests cannot: the 8B preset writes (sharded), loads onto the GPU
without a CPU copy of the weights, and both attention backends agree on it; prints timings.
Run: python3 -m pytest -q -s -m gpu tests/integration/models/test_llama3_8b_gpu.py
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from eagletree.adapters.models.loading import load_models
from eagletree.adapters.models.random_checkpoint import write_random_checkpoint
from eagletree.adapters.models.random_checkpoint_config import PRESETS
from eagletree.adapters.models.runner import DraftModelRunner, TargetModelRunner
from tests.conftest import requires_cuda
from tests.integration.models.harness import (
    BACKENDS,
    Memory,
    Requests,
    random_prompts,
    relative_error,
)

pytestmark = [pytest.mark.gpu, pytest.mark.slow, requires_cuda]


def test_llama3_8b_random_checkpoint_loads_and_both_backends_agree(tmp_path: Path) -> None:
    device, dtype = torch.device("cuda"), torch.bfloat16
    sizes = PRESETS["llama3-8b"]
    start = time.perf_counter()
    target_dir, draft_dir = write_random_checkpoint(
        tmp_path, "llama", "eagle3", seed=0, sizes=sizes, dtype=dtype, device=device
    )
    written = time.perf_counter()
    models = load_models(target_dir, draft_dir, "eagle3", dtype, device)
    torch.cuda.synchronize()
    loaded = time.perf_counter()
    assert len(list(target_dir.glob("*.safetensors"))) > 1  # sharded with an index
    assert sum(p.numel() for p in models.target.parameters()) == 8_030_261_248
    print(f"\nwrite {written - start:.1f} s, load {loaded - written:.1f} s")

    prompts = random_prompts(sizes.vocab_size, [40, 17], seed=1)
    steps = random_prompts(sizes.vocab_size, [3, 3], seed=2)
    logits: dict[str, list[torch.Tensor]] = {}
    for backend in BACKENDS:
        memory = Memory(device, num_slots=1024, max_requests=4)
        target = TargetModelRunner(
            models.target, *memory.runner_parts(models.target.kv_layout, backend, dtype)
        )
        requests = Requests(memory, 2)
        outputs = [target.forward(requests.extend(prompts))]
        outputs += [target.forward(requests.decode([a, b])) for a, b in zip(*steps, strict=True)]
        logits[backend] = [out.logits for out in outputs]
        head = models.drafts[0]
        draft = DraftModelRunner(head, *memory.runner_parts(head.kv_layout, backend, dtype))
        aux = outputs[0].aux_hidden_states
        assert aux is not None and aux.shape == (57, 3 * 4096)
        draft_out = draft.forward(Requests(memory, 2).extend(prompts), aux)
        finite = torch.isfinite(draft_out.logits).sum(-1)
        assert torch.equal(finite.cpu(), torch.full((57,), sizes.draft_vocab_size))
    for ours, theirs in zip(logits["triton"], logits["torch"], strict=True):
        assert torch.isfinite(ours).all()
        error = relative_error(ours, theirs)
        print(f"triton vs torch backend, bf16 logits: max relative difference {error:.2e}")
        assert error <= 2e-2
