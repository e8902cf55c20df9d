"""Adapter: build draft heads from checkpoint directories, sharing the target's modules.

Formats: EAGLE-1 heads (SafeAILab ``LlamaForCausalLM`` with one layer, SGLang
``LlamaForCausalLMEagle``); EAGLE-3 heads (``LlamaForCausalLMEagle3`` / SafeAILab: ``fc``,
``midlayer.*``, ``norm``, ``lm_head``, ``d2t``, ``t2d``); MTP layers either inside a DeepSeek-V3
checkpoint (``model.layers.{L + i}.*``) or in an exported ``*ForCausalLMNextN`` directory
(``model.layers.{i}.*``). A draft must match its target's hidden and vocabulary sizes; it reads
the target's embedding and lm_head instead of its own, and follows the target's tensor
parallelism.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import torch

from eagletree.adapters.models.config import (
    ConfigReader,
    LlamaConfig,
    MLAConfig,
    parse_llama_config,
    parse_mla_config,
)
from eagletree.adapters.models.eagle import EagleDraft, SharedTargetModules
from eagletree.adapters.models.eagle3 import Eagle3Draft
from eagletree.adapters.models.model_building import (
    TargetModel,
    fused_or_default,
    materialize,
    strip_model_prefix,
)
from eagletree.adapters.models.mtp import MTPLayer
from eagletree.adapters.models.stack import default_aux_layer_ids
from eagletree.adapters.models.tensor_files import Rename, TensorFiles, fill_module
from eagletree.domain.errors import ConfigurationError

DraftKind = Literal["eagle", "eagle3", "mtp"]
DraftModel = EagleDraft | Eagle3Draft | MTPLayer

EAGLE_ARCHITECTURES = ("LlamaForCausalLMEagle", "LlamaForCausalLM")
EAGLE3_ARCHITECTURES = ("LlamaForCausalLMEagle3", "LlamaForCausalLM")
MTP_ARCHITECTURES = ("DeepseekV3ForCausalLMNextN", "LlamaForCausalLMNextN", "DeepseekV3ForCausalLM")


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


def _llama_head_config(
    path: str | Path, kind: str, allowed: tuple[str, ...], target: TargetModel
) -> tuple[ConfigReader, LlamaConfig]:
    """An EAGLE-family head's config and its reader, once its architecture and sizes fit."""
    reader = ConfigReader.from_dir(path)
    _check_architecture(reader, kind, allowed)
    config = parse_llama_config(reader)
    _check_compatible(reader, config.hidden_size, config.vocab_size, target)
    return reader, config


def load_eagle_draft(
    path: str | Path,
    target: TargetModel,
    dtype: torch.dtype,
    fused_kernels: bool | None = None,
    token_map: torch.Tensor | None = None,
) -> EagleDraft:
    """``token_map``: (n,) distinct target ids the head proposes from (``read_token_map``)."""
    _, config = _llama_head_config(path, "EAGLE", EAGLE_ARCHITECTURES, target)
    files = TensorFiles(path)
    fc_bias = any(strip_model_prefix(name) == "fc.bias" for name in files.names())
    device = target.embed_tokens.weight.device
    fused = fused_or_default(fused_kernels, device)
    draft = materialize(
        lambda: EagleDraft(config, _shared(target), fc_bias, fused, target.tp), dtype, device
    )

    def rename(name: str) -> str | None:
        rest = strip_model_prefix(name)
        return None if rest in ("embed_tokens.weight", "lm_head.weight") else rest

    fill_module(draft, files, rename, "EAGLE head")
    if fused:
        draft.fold_norms()
    if token_map is not None:
        draft.restrict_vocabulary(token_map)
    return draft


def load_eagle3_draft(
    path: str | Path, target: TargetModel, dtype: torch.dtype, fused_kernels: bool | None = None
) -> Eagle3Draft:
    reader, config = _llama_head_config(path, "EAGLE-3", EAGLE3_ARCHITECTURES, target)
    draft_vocab = reader.get_int("draft_vocab_size", config.vocab_size)
    target_hidden = reader.get_int("target_hidden_size", target.hidden_size)
    if target_hidden != target.hidden_size:
        raise reader.error(
            f"target_hidden_size {target_hidden} differs from the target's {target.hidden_size}"
        )
    if not 0 < draft_vocab <= config.vocab_size:
        raise reader.error(f"draft_vocab_size {draft_vocab} is outside 1..{config.vocab_size}")
    device = target.embed_tokens.weight.device
    fused = fused_or_default(fused_kernels, device)
    draft = materialize(
        lambda: Eagle3Draft(config, _shared(target), draft_vocab, target_hidden, fused, target.tp),
        dtype,
        device,
    )
    draft.d2t.zero_()  # an identity map when the checkpoint has no d2t (full vocabulary)

    def rename(name: str) -> str | None:
        rest = strip_model_prefix(name)
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
    if draft.draft_to_target.is_meta:  # names and shapes alone: no map was read
        return
    # SYNC: one-time validation of the vocabulary map at load time.
    targets = draft.draft_to_target.cpu()
    vocab = draft.vocab_size
    if targets.numel() and (int(targets.min()) < 0 or int(targets.max()) >= vocab):
        raise ConfigurationError(
            f"{source}: d2t maps draft ids outside the target vocabulary 0..{vocab - 1}"
        )
    if torch.unique(targets).numel() != targets.numel():
        raise ConfigurationError(f"{source}: d2t maps two draft ids to one target id")
    t2d_names = [name for name in files.names() if strip_model_prefix(name) == "t2d"]
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
    fused = fused_or_default(fused_kernels, device)
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
    token_map: torch.Tensor | None = None,
) -> list[DraftModel]:
    """``token_map`` (EAGLE heads only): the target ids the head proposes from."""
    if token_map is not None and kind != "eagle":
        raise ConfigurationError(f"a token map restricts EAGLE heads, not {kind} drafts")
    if kind == "eagle":
        return [load_eagle_draft(path, target, dtype, fused_kernels, token_map)]
    if kind == "eagle3":
        return [load_eagle3_draft(path, target, dtype, fused_kernels)]
    return list(load_mtp_layers(path, target, dtype, fused_kernels))
