"""Adapter: write random target and draft checkpoints in the formats ``loading`` reads.

Tensor names and shapes come from the models themselves (built on the meta device), so what is
written always loads; the sizes and ``config.json`` files are those of
``random_checkpoint_config``. Large checkpoints are
written in shards with an index.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

from eagletree.adapters.models.config import (
    ConfigReader,
    LlamaConfig,
    MLAConfig,
    parse_llama_config,
    parse_mla_config,
)
from eagletree.adapters.models.deepseek_mla import DeepseekMLAForCausalLM
from eagletree.adapters.models.eagle import EagleDraft, SharedTargetModules
from eagletree.adapters.models.eagle3 import Eagle3Draft
from eagletree.adapters.models.llama import LlamaForCausalLM
from eagletree.adapters.models.mtp import MTPLayer
from eagletree.adapters.models.random_checkpoint_config import (
    PRESETS,
    Arch,
    Draft,
    ModelSizes,
    draft_config,
    target_config,
)
from eagletree.adapters.models.tensor_files import INDEX_FILE, module_tensors


def _parse(config: dict[str, Any]) -> LlamaConfig | MLAConfig:
    reader = ConfigReader(config, "<random checkpoint>")
    if config["architectures"][0].startswith("Deepseek"):
        return parse_mla_config(reader)
    return parse_llama_config(reader)


def _meta_target(config: LlamaConfig | MLAConfig) -> LlamaForCausalLM | DeepseekMLAForCausalLM:
    with torch.device("meta"):
        if isinstance(config, MLAConfig):
            return DeepseekMLAForCausalLM(config)
        return LlamaForCausalLM(config)


def _named_shapes(module: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    yield from module_tensors(module).items()


def checkpoint_layout(
    arch: Arch, draft: Draft | None, sizes: ModelSizes
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Meta tensors by checkpoint name: (target, draft); the draft's is empty without a draft."""
    target_cfg = _parse(target_config(arch, sizes))
    target = _meta_target(target_cfg)
    target_names = {
        (name if name.startswith("lm_head.") else f"model.{name}"): t
        for name, t in _named_shapes(target)
    }
    if draft is None:
        return target_names, {}
    shared = SharedTargetModules(target.embed_tokens, target.lm_head)
    draft_cfg = _parse(draft_config(arch, draft, sizes))
    with torch.device("meta"):
        if draft == "eagle":
            assert isinstance(draft_cfg, LlamaConfig)
            return target_names, dict(_named_shapes(EagleDraft(draft_cfg, shared, fc_bias=True)))
        if draft == "eagle3":
            assert isinstance(draft_cfg, LlamaConfig)
            head = Eagle3Draft(draft_cfg, shared, sizes.draft_vocab_size, sizes.hidden_size)
            names = dict(_named_shapes(head))
            names["t2d"] = torch.empty(sizes.vocab_size, dtype=torch.bool, device="meta")
            return target_names, names
        layer = MTPLayer(draft_cfg, shared)
    names = {}
    for i in range(sizes.num_mtp_layers):
        for name, t in _named_shapes(layer):
            names[f"model.layers.{i}.{name.removeprefix('decoder.')}"] = t
    return target_names, names


def _random_tensor(
    name: str, like: torch.Tensor, dtype: torch.dtype, generator: torch.Generator, std: float
) -> torch.Tensor:
    device = generator.device
    if name.endswith("norm.weight"):
        return torch.ones(like.shape, dtype=dtype, device=device)
    if not like.dtype.is_floating_point:
        return torch.zeros(like.shape, dtype=like.dtype, device=device)
    values = torch.randn(like.shape, generator=generator, device=device) * std
    return values.to(dtype)


def _vocab_map(sizes: ModelSizes, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """d2t / t2d of a draft vocabulary: a sorted random subset of the target ids."""
    chosen = torch.randperm(sizes.vocab_size, generator=generator, device=generator.device)
    target_ids = chosen[: sizes.draft_vocab_size].sort().values.cpu()
    t2d = torch.zeros(sizes.vocab_size, dtype=torch.bool)
    t2d[target_ids] = True
    return {"d2t": target_ids - torch.arange(sizes.draft_vocab_size), "t2d": t2d}


def save_checkpoint(
    out_dir: Path,
    config: dict[str, Any],
    shard_plan: list[list[str]],
    make: Callable[[str], torch.Tensor],
) -> None:
    """Write ``config.json`` and ``make(name)`` for every name, one file per shard (+ index)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if len(shard_plan) == 1:
        tensors = {name: make(name).cpu() for name in shard_plan[0]}
        save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
        return
    weight_map: dict[str, str] = {}
    for index, names in enumerate(shard_plan):
        file = f"model-{index + 1:05d}-of-{len(shard_plan):05d}.safetensors"
        save_file({name: make(name).cpu() for name in names}, str(out_dir / file), {"format": "pt"})
        weight_map.update(dict.fromkeys(names, file))
    index_json = {"metadata": {}, "weight_map": weight_map}
    (out_dir / INDEX_FILE).write_text(json.dumps(index_json, indent=2) + "\n")


def _shard_plan(
    layout: dict[str, torch.Tensor], dtype: torch.dtype, max_bytes: int
) -> list[list[str]]:
    plan: list[list[str]] = [[]]
    size = 0
    for name, like in layout.items():
        nbytes = like.numel() * (
            dtype.itemsize if like.dtype.is_floating_point else like.element_size()
        )
        if plan[-1] and size + nbytes > max_bytes:
            plan.append([])
            size = 0
        plan[-1].append(name)
        size += nbytes
    return plan


def write_random_checkpoint(
    out_dir: str | Path,
    arch: Arch,
    draft: Draft | None,
    seed: int = 0,
    sizes: ModelSizes | None = None,
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str = "cpu",
    std: float = 0.02,
    max_shard_bytes: int = 4 << 30,
) -> tuple[Path, Path | None]:
    """Write ``out_dir/target`` (and ``out_dir/draft``); returns both directories."""
    sizes = sizes or PRESETS["tiny"]
    if draft == "eagle3" and not 0 < sizes.draft_vocab_size <= sizes.vocab_size:
        raise ValueError(
            f"draft_vocab_size {sizes.draft_vocab_size} must be in 1..vocab_size {sizes.vocab_size}"
        )
    root = Path(out_dir)
    generator = torch.Generator(device=device).manual_seed(seed)
    target_layout, draft_layout = checkpoint_layout(arch, draft, sizes)
    extra = _vocab_map(sizes, generator) if draft == "eagle3" else {}

    def writer(layout: dict[str, torch.Tensor]) -> Callable[[str], torch.Tensor]:
        def make(name: str) -> torch.Tensor:
            fixed = extra.get(name)
            if fixed is not None:
                return fixed
            return _random_tensor(name, layout[name], dtype, generator, std)

        return make

    dtype_name = str(dtype).removeprefix("torch.")
    target_dir = root / "target"
    target_cfg = {**target_config(arch, sizes), "dtype": dtype_name}
    if draft == "mtp":  # the target declares the MTP layers its NextN export next to it holds
        target_cfg["num_nextn_predict_layers"] = sizes.num_mtp_layers
    save_checkpoint(
        target_dir,
        target_cfg,
        _shard_plan(target_layout, dtype, max_shard_bytes),
        writer(target_layout),
    )
    if draft is None:
        return target_dir, None
    draft_dir = root / "draft"
    save_checkpoint(
        draft_dir,
        {**draft_config(arch, draft, sizes), "dtype": dtype_name},
        _shard_plan(draft_layout, dtype, max_shard_bytes),
        writer(draft_layout),
    )
    return target_dir, draft_dir
