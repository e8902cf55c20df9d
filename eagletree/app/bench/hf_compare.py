"""Application: transformers' ``generate`` on the bench's checkpoint, timed and compared.

The engine's plain greedy output for the same prompts is the reference: a row says how many of
transformers' tokens agree with it before the first divergence (all of them in fp32; bf16
rounding flips the argmax of a random model's near-flat logits sooner or later).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from eagletree.app.bench.rows import HFRow
from eagletree.domain.errors import ConfigurationError


def load_hf_model(target: Path, dtype: torch.dtype, device: str) -> Any:
    """The target as a transformers model in eval mode; ConfigurationError without the extra."""
    try:
        import transformers
    except ImportError as error:
        raise ConfigurationError("--hf needs transformers (pip install 'eagletree[hf]')") from error
    model: Any = transformers.AutoModelForCausalLM.from_pretrained(target, dtype=dtype)
    return model.to(device).eval()


def hf_generate(model: Any, prompts: Sequence[Sequence[int]], new_tokens: int) -> list[list[int]]:
    """Greedy continuations of equal-length prompts (so no padding), EOS ignored."""
    ids = torch.tensor([list(p) for p in prompts], device=model.device)
    with torch.inference_mode():
        output = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    tokens: list[list[int]] = output[:, ids.shape[1] :].tolist()
    return tokens


def measure_hf(
    model: Any,
    prompts: Sequence[Sequence[int]],
    new_tokens: int,
    reference: Sequence[Sequence[int]],
    cuda: bool,
) -> HFRow:
    """Time one ``generate`` after a short warm-up and compare it with ``reference``."""
    hf_generate(model, prompts, 2)
    if cuda:
        torch.cuda.synchronize()  # SYNC: time only this call's kernels
    started = time.perf_counter()
    outputs = hf_generate(model, prompts, new_tokens)
    if cuda:
        torch.cuda.synchronize()  # SYNC: the wall clock must cover the queued kernels
    seconds = time.perf_counter() - started
    matching = sum(common_prefix(a, b) for a, b in zip(outputs, reference, strict=True))
    total = sum(len(r) for r in reference)
    return HFRow(
        batch_size=len(prompts),
        tokens_per_s=len(prompts) * new_tokens / seconds,
        ms_per_token=1000.0 * seconds / new_tokens,
        matching_share=matching / total if total else 1.0,
    )


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return index
    return min(len(a), len(b))
