"""Host → device copies that never wait for the device (pinned staging on CUDA)."""

from __future__ import annotations

import torch


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Host → device copy that does not wait for the device (pinned staging on CUDA)."""
    if device.type == "cpu":
        return host
    return host.pin_memory().to(device, non_blocking=True)
