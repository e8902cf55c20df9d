"""Adapter: building a model for a checkpoint loader, on the meta device and then allocated.

The target and draft loaders share this: models are built on the meta device and filled in
place, so no random initialisation is spent on multi-gigabyte weights; ``fused_kernels`` left
None is on for CUDA and off elsewhere (the CPU runs Triton only in the interpreter, far too
slowly); every tensor name of a checkpoint may carry a leading ``model.``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch
from torch import nn

from eagletree.adapters.models.deepseek_mla import DeepseekMLAForCausalLM
from eagletree.adapters.models.llama import LlamaForCausalLM
from eagletree.adapters.models.rotary import RotaryEmbedding

TargetModel = LlamaForCausalLM | DeepseekMLAForCausalLM

M = TypeVar("M", bound=nn.Module)


def materialize(build: Callable[[], M], dtype: torch.dtype, device: torch.device | str) -> M:
    """Build on the meta device, allocate (uninitialised) on ``device`` in ``dtype``, re-tie."""
    with torch.device("meta"):
        module = build()
    module = module.to(dtype=dtype)
    module.to_empty(device=device)
    for sub in module.modules():
        if isinstance(sub, RotaryEmbedding):
            sub.reset_parameters()
        tie = getattr(sub, "tie_weights", None)
        if callable(tie):
            tie()
    module.eval().requires_grad_(False)
    return module


def default_fused_kernels(device: torch.device | str) -> bool:
    """Triton kernels on CUDA, the torch reference elsewhere."""
    return torch.device(device).type == "cuda"


def fused_or_default(fused_kernels: bool | None, device: torch.device | str) -> bool:
    """``fused_kernels`` as given, or the default for ``device`` when it is None."""
    return default_fused_kernels(device) if fused_kernels is None else fused_kernels


def strip_model_prefix(name: str) -> str:
    """A checkpoint tensor name without its optional leading ``model.``."""
    return name.removeprefix("model.")
