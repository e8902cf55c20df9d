"""Adapter: build target models from checkpoint directories, and their drafts with them.

Formats: HF ``LlamaForCausalLM`` and ``DeepseekV3ForCausalLM`` targets; the draft formats are
``draft_loading``'s. Every tensor name may carry a
leading ``model.``. Models are built on the meta device and filled in place
(``model_building``), so no random initialisation is spent on multi-gigabyte weights. Merged
projections (q/k/v, gate/up, MLA's q_a/kv_a) are filled from the checkpoint's separate tensors
(``MergedLinear``).

Under tensor parallelism (``tp``, the target's group; its drafts follow it) every rank builds
its shard of each model and reads only its blocks of the sharded tensors from the checkpoint.

``fused_kernels`` picks the models' Triton kernels over the torch reference code; left None it
is on for CUDA and off elsewhere (the CPU runs Triton only in the interpreter, far too slowly).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import torch

from eagletree.adapters.models.config import ConfigReader, parse_llama_config, parse_mla_config
from eagletree.adapters.models.deepseek_mla import DeepseekMLAForCausalLM
from eagletree.adapters.models.dense_group import DenseGroup
from eagletree.adapters.models.draft_loading import (
    DraftKind,
    DraftModel,
    eagle3_aux_layer_ids,
    load_draft,
)
from eagletree.adapters.models.llama import LlamaForCausalLM
from eagletree.adapters.models.model_building import (
    TargetModel,
    fused_or_default,
    materialize,
    strip_model_prefix,
)
from eagletree.adapters.models.tensor_files import TensorFiles, fill_module
from eagletree.adapters.models.tensor_parallel import SINGLE, TensorParallel

TARGET_ARCHITECTURES = ("LlamaForCausalLM", "DeepseekV3ForCausalLM")


class LoadedModels(NamedTuple):
    target: TargetModel
    drafts: list[DraftModel]  # one head for EAGLE / EAGLE-3, one per layer for MTP


def load_target(
    path: str | Path,
    dtype: torch.dtype,
    device: torch.device | str,
    aux_layer_ids: Sequence[int] = (),
    fused_kernels: bool | None = None,
    tp: TensorParallel = SINGLE,
    dense: DenseGroup | None = None,
) -> TargetModel:
    """The target model of an HF checkpoint directory, capturing ``aux_layer_ids`` (EAGLE-3);
    this rank's shard of it under ``tp``; with ``dense`` its embedding, MLPs and lm_head
    sharded over that data-parallel group."""
    reader = ConfigReader.from_dir(path)
    architecture = reader.architecture()
    fused = fused_or_default(fused_kernels, device)
    model: TargetModel
    if architecture == "LlamaForCausalLM":
        llama = parse_llama_config(reader)
        model = materialize(
            lambda: LlamaForCausalLM(llama, aux_layer_ids, fused, tp, dense), dtype, device
        )
    elif architecture == "DeepseekV3ForCausalLM":
        mla = parse_mla_config(reader)
        model = materialize(
            lambda: DeepseekMLAForCausalLM(mla, aux_layer_ids, fused, tp, dense), dtype, device
        )
    else:
        raise reader.error(
            f"target architecture {architecture!r} is not supported "
            f"(supported: {', '.join(TARGET_ARCHITECTURES)})"
        )
    num_layers, tied = model.config.num_hidden_layers, model.config.tie_word_embeddings

    def rename(name: str) -> str | None:
        if name == "lm_head.weight":
            return None if tied else name
        rest = strip_model_prefix(name)
        layer = re.match(r"layers\.(\d+)\.", rest)
        if layer is not None and int(layer[1]) >= num_layers:
            return None  # MTP layers published inside the target checkpoint
        return None if rest.endswith("rotary_emb.inv_freq") else rest

    fill_module(model, TensorFiles(path), rename, f"{architecture} target")
    if fused and isinstance(model, LlamaForCausalLM):
        # decode steps then skip the norm launches (an inference model: never saved)
        model.fold_norms()
    return model


def load_models(
    target_path: str | Path,
    draft_path: str | Path | None,
    draft_kind: DraftKind | None,
    dtype: torch.dtype,
    device: torch.device | str,
    fused_kernels: bool | None = None,
    tp: TensorParallel = SINGLE,
) -> LoadedModels:
    """Target and draft(s) together: an EAGLE-3 draft decides which target layers are captured;
    this rank's shards of them under ``tp``."""
    aux: tuple[int, ...] = ()
    if draft_kind == "eagle3" and draft_path is not None:
        num_layers = ConfigReader.from_dir(target_path).get_int("num_hidden_layers")
        aux = eagle3_aux_layer_ids(draft_path, num_layers)
    target = load_target(target_path, dtype, device, aux, fused_kernels, tp)
    if draft_kind is None or draft_path is None:
        return LoadedModels(target, [])
    drafts = load_draft(draft_path, draft_kind, target, dtype, fused_kernels)
    return LoadedModels(target, drafts)
