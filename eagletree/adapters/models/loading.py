"""Adapter: build target models and draft heads from checkpoint directories.

Formats: HF ``LlamaForCausalLM`` and ``DeepseekV3ForCausalLM`` targets; EAGLE-1 heads
(SafeAILab ``LlamaForCausalLM`` with one layer, SGLang ``LlamaForCausalLMEagle``); EAGLE-3 heads
(``LlamaForCausalLMEagle3`` / SafeAILab: ``fc``, ``midlayer.*``, ``norm``, ``lm_head``, ``d2t``,
``t2d``); MTP layers either inside a DeepSeek-V3 checkpoint (``model.layers.{L + i}.*``) or in
an exported ``*ForCausalLMNextN`` directory (``model.layers.{i}.*``). Every tensor name may carry a
leading ``model.``. Models are built on the meta device and filled in place, so no random
initialisation is spent on multi-gigabyte weights. Merged projections (q/k/v, gate/up, MLA's
q_a/kv_a) are filled from the checkpoint's separate tensors (``MergedLinear``).

Under tensor parallelism (``tp``, the target's group; its drafts follow it) every rank builds
its shard of each model and reads only its blocks of the sharded tensors from the checkpoint.

``fused_kernels`` picks the models' Triton kernels over the torch reference code; left None it
is on for CUDA and off elsewhere (the CPU runs Triton only in the interpreter, far too slowly).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal, NamedTuple, TypeVar

import torch
from torch import nn

from eagletree.adapters.models.config import (
    ConfigReader,
    LlamaConfig,
    MLAConfig,
    parse_llama_config,
    parse_mla_config,
)
from eagletree.adapters.models.deepseek_mla import DeepseekMLAForCausalLM
from eagletree.adapters.models.dense_group import DenseGroup
from eagletree.adapters.models.eagle import EagleDraft, SharedTargetModules
from eagletree.adapters.models.eagle3 import Eagle3Draft
from eagletree.adapters.models.layers import RotaryEmbedding
from eagletree.adapters.models.llama import LlamaForCausalLM
from eagletree.adapters.models.mtp import MTPLayer
from eagletree.adapters.models.stack import default_aux_layer_ids
from eagletree.adapters.models.tensor_files import Rename, TensorFiles, fill_module
from eagletree.adapters.models.tensor_parallel import SINGLE, TensorParallel
from eagletree.domain.errors import ConfigurationError

DraftKind = Literal["eagle", "eagle3", "mtp"]
TargetModel = LlamaForCausalLM | DeepseekMLAForCausalLM
DraftModel = EagleDraft | Eagle3Draft | MTPLayer

TARGET_ARCHITECTURES = ("LlamaForCausalLM", "DeepseekV3ForCausalLM")
EAGLE_ARCHITECTURES = ("LlamaForCausalLMEagle", "LlamaForCausalLM")
EAGLE3_ARCHITECTURES = ("LlamaForCausalLMEagle3", "LlamaForCausalLM")
MTP_ARCHITECTURES = ("DeepseekV3ForCausalLMNextN", "LlamaForCausalLMNextN", "DeepseekV3ForCausalLM")

M = TypeVar("M", bound=nn.Module)


class LoadedModels(NamedTuple):
    target: TargetModel
    drafts: list[DraftModel]  # one head for EAGLE / EAGLE-3, one per layer for MTP


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


def _fused(fused_kernels: bool | None, device: torch.device | str) -> bool:
    return default_fused_kernels(device) if fused_kernels is None else fused_kernels


def _strip_model(name: str) -> str:
    return name.removeprefix("model.")


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
    fused = _fused(fused_kernels, device)
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
        rest = _strip_model(name)
        layer = re.match(r"layers\.(\d+)\.", rest)
        if layer is not None and int(layer[1]) >= num_layers:
            return None  # MTP layers published inside the target checkpoint
        return None if rest.endswith("rotary_emb.inv_freq") else rest

    fill_module(model, TensorFiles(path), rename, f"{architecture} target")
    if fused and isinstance(model, LlamaForCausalLM):
        # decode steps then skip the norm launches (an inference model: never saved)
        model.fold_norms()
    return model


def eagle3_aux_layer_ids(draft_path: str | Path, target_num_layers: int) -> tuple[int, ...]:
    """The target layers whose inputs an EAGLE-3 head reads.

    A draft config may list ``eagle_config.eagle_aux_hidden_state_layer_ids`` as layer *outputs*
    (SGLang captures the input of id + 1); otherwise (2, L/2, L−3).
    """
    reader = ConfigReader.from_dir(draft_path)
    eagle_config = reader.raw.get("eagle_config") or {}
    ids = (
        eagle_config.get("eagle_aux_hidden_state_layer_ids")
        if isinstance(eagle_config, dict)
        else None
    )
    if not ids:
        return default_aux_layer_ids(target_num_layers)
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        raise reader.error(f"eagle_aux_hidden_state_layer_ids must be integers, got {ids!r}")
    return tuple(i + 1 for i in ids)


def _check_compatible(
    reader: ConfigReader, draft_hidden: int, draft_vocab: int, target: TargetModel
) -> None:
    if draft_hidden != target.hidden_size:
        raise reader.error(
            f"draft hidden_size {draft_hidden} differs from the target's {target.hidden_size}:"
            " the draft shares the target's embedding, so this draft belongs to another target"
        )
    if draft_vocab != target.vocab_size:
        raise reader.error(
            f"draft vocab_size {draft_vocab} differs from the target's {target.vocab_size}:"
            " this draft belongs to another target"
        )


def _check_architecture(reader: ConfigReader, kind: str, allowed: tuple[str, ...]) -> str:
    architecture = reader.architecture()
    if architecture not in allowed:
        raise reader.error(
            f"architecture {architecture!r} is not a {kind} draft"
            f" (expected one of {', '.join(allowed)})"
        )
    return architecture


def _shared(target: TargetModel) -> SharedTargetModules:
    return SharedTargetModules(target.embed_tokens, target.lm_head)


def load_eagle_draft(
    path: str | Path, target: TargetModel, dtype: torch.dtype, fused_kernels: bool | None = None
) -> EagleDraft:
    reader = ConfigReader.from_dir(path)
    _check_architecture(reader, "EAGLE", EAGLE_ARCHITECTURES)
    config = parse_llama_config(reader)
    _check_compatible(reader, config.hidden_size, config.vocab_size, target)
    files = TensorFiles(path)
    fc_bias = any(_strip_model(name) == "fc.bias" for name in files.names())
    device = target.embed_tokens.weight.device
    fused = _fused(fused_kernels, device)
    draft = materialize(
        lambda: EagleDraft(config, _shared(target), fc_bias, fused, target.tp), dtype, device
    )

    def rename(name: str) -> str | None:
        rest = _strip_model(name)
        return None if rest in ("embed_tokens.weight", "lm_head.weight") else rest

    fill_module(draft, files, rename, "EAGLE head")
    if fused:
        draft.fold_norms()
    return draft


def load_eagle3_draft(
    path: str | Path, target: TargetModel, dtype: torch.dtype, fused_kernels: bool | None = None
) -> Eagle3Draft:
    reader = ConfigReader.from_dir(path)
    _check_architecture(reader, "EAGLE-3", EAGLE3_ARCHITECTURES)
    config = parse_llama_config(reader)
    _check_compatible(reader, config.hidden_size, config.vocab_size, target)
    draft_vocab = reader.get_int("draft_vocab_size", config.vocab_size)
    target_hidden = reader.get_int("target_hidden_size", target.hidden_size)
    if target_hidden != target.hidden_size:
        raise reader.error(
            f"target_hidden_size {target_hidden} differs from the target's {target.hidden_size}"
        )
    if not 0 < draft_vocab <= config.vocab_size:
        raise reader.error(f"draft_vocab_size {draft_vocab} is outside 1..{config.vocab_size}")
    device = target.embed_tokens.weight.device
    fused = _fused(fused_kernels, device)
    draft = materialize(
        lambda: Eagle3Draft(config, _shared(target), draft_vocab, target_hidden, fused, target.tp),
        dtype,
        device,
    )
    draft.d2t.zero_()  # an identity map when the checkpoint has no d2t (full vocabulary)

    def rename(name: str) -> str | None:
        rest = _strip_model(name)
        if rest in ("embed_tokens.weight", "t2d"):
            return None
        if rest.startswith("layers.0."):
            return "midlayer." + rest.removeprefix("layers.0.")
        return rest

    files = TensorFiles(path)
    optional = frozenset({"d2t"}) if draft_vocab == config.vocab_size else frozenset()
    fill_module(draft, files, rename, "EAGLE-3 head", optional)
    draft.reset_vocab_map()
    _check_vocab_map(draft, files, reader.source)
    return draft


def _check_vocab_map(draft: Eagle3Draft, files: TensorFiles, source: str) -> None:
    # SYNC: one-time validation of the vocabulary map at load time.
    targets = draft.draft_to_target.cpu()
    vocab = draft.vocab_size
    if targets.numel() and (int(targets.min()) < 0 or int(targets.max()) >= vocab):
        raise ConfigurationError(
            f"{source}: d2t maps draft ids outside the target vocabulary 0..{vocab - 1}"
        )
    if torch.unique(targets).numel() != targets.numel():
        raise ConfigurationError(f"{source}: d2t maps two draft ids to one target id")
    t2d_names = [name for name in files.names() if _strip_model(name) == "t2d"]
    if t2d_names:
        _, t2d = next(files.read(t2d_names[:1], torch.device("cpu")))
        mask = torch.zeros(vocab, dtype=torch.bool)
        mask[targets] = True
        if t2d.shape != (vocab,) or not torch.equal(t2d.bool(), mask):
            raise ConfigurationError(f"{files.file_of(t2d_names[0])}: t2d does not match d2t")


def load_mtp_layers(
    path: str | Path, target: TargetModel, dtype: torch.dtype, fused_kernels: bool | None = None
) -> list[MTPLayer]:
    """Every MTP layer of ``path`` (a NextN export, or a DeepSeek-V3 checkpoint that has them)."""
    reader = ConfigReader.from_dir(path)
    architecture = _check_architecture(reader, "MTP", MTP_ARCHITECTURES)
    config: LlamaConfig | MLAConfig
    config = (
        parse_llama_config(reader) if architecture.startswith("Llama") else parse_mla_config(reader)
    )
    _check_compatible(reader, config.hidden_size, config.vocab_size, target)
    if architecture.endswith("NextN"):
        first, count = 0, config.num_hidden_layers
    else:
        assert isinstance(config, MLAConfig)
        first, count = config.num_hidden_layers, config.num_nextn_predict_layers
        experts = reader.get_int("n_routed_experts", 0)
        if experts and reader.get_int("first_k_dense_replace", 0) < first + count:
            raise reader.error(
                "the MTP layers are mixture-of-experts layers; only dense MLPs are supported"
            )
    if count < 1:
        raise reader.error("the checkpoint has no MTP layers (num_nextn_predict_layers = 0)")
    files = TensorFiles(path)
    device = target.embed_tokens.weight.device
    fused = _fused(fused_kernels, device)
    layers = []
    for i in range(count):
        layer = materialize(
            lambda: MTPLayer(config, _shared(target), fused, target.tp), dtype, device
        )
        fill_module(layer, files, _mtp_rename(f"model.layers.{first + i}."), f"MTP layer {i}")
        layers.append(layer)
    return layers


def _mtp_rename(prefix: str) -> Rename:
    own = ("enorm.", "hnorm.", "eh_proj.", "shared_head.norm.")

    def rename(name: str) -> str | None:
        if not name.startswith(prefix):
            return None
        rest = name.removeprefix(prefix)
        if rest.startswith(("embed_tokens.", "shared_head.head.")):
            return None  # copies of the target's embedding and head
        return rest if rest.startswith(own) else "decoder." + rest

    return rename


def load_draft(
    path: str | Path,
    kind: DraftKind,
    target: TargetModel,
    dtype: torch.dtype,
    fused_kernels: bool | None = None,
) -> list[DraftModel]:
    if kind == "eagle":
        return [load_eagle_draft(path, target, dtype, fused_kernels)]
    if kind == "eagle3":
        return [load_eagle3_draft(path, target, dtype, fused_kernels)]
    return list(load_mtp_layers(path, target, dtype, fused_kernels))


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
