"""Run settings: what a command will run — settings resolved for the machine, the embedded
default filled in, the checkpoints checked and described without loading their weights.

`generate`, `serve`, `config show` and `config validate` all go through ``settings_for_run``,
so that what `config show` prints is what the others build; `generate` and `serve` through
``prepare_settings``. (The CPU threads are set where the engine is built: ``build_engine``.)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from eagletree.app.composition.platform import resolve_platform
from eagletree.config.settings import EngineSettings
from eagletree.config.target import TargetDescription
from eagletree.domain.errors import ConfigurationError

if TYPE_CHECKING:
    import torch

    from eagletree.config.eagle_hook import Algorithm

EMBEDDED_DEFAULT_NOTE = (
    "embedded default: EAGLE tree speculation with the default checkpoint's draft head "
    "(set EAGLETREE_SPECULATIVE__ALGORITHM=none to turn it off)"
)


def load_settings(path: str | Path | None) -> EngineSettings:
    """The settings of ``path`` (a .toml / .yaml file) or, when None, environment + defaults."""
    return EngineSettings() if path is None else EngineSettings.from_file(path)


def settings_for_run(
    settings: EngineSettings,
    notify: Callable[[str], None],
    *,
    create_default: bool = True,
) -> EngineSettings:
    """Concrete settings: "auto" values resolved, and without model.target_path the embedded
    default checkpoint (written on first use unless ``create_default`` is False) with its EAGLE
    head, speculating unless speculative.algorithm was chosen."""
    from eagletree.app.composition.default_checkpoint import (
        default_checkpoint_dir,
        default_draft_dir,
        ensure_default_checkpoint,
    )

    resolved = resolve_platform(settings)
    if settings.model.device == "auto" and resolved.model.device == "cpu":
        notify(
            "no CUDA device: running on the CPU (model.device = 'auto') in "
            f"{resolved.model.dtype} with the {resolved.backend.attention} attention backend"
        )
    settings = resolved
    if settings.model.target_path is not None:
        return settings
    if create_default:
        target = ensure_default_checkpoint(notify=notify)
    else:
        target = default_checkpoint_dir() / "target"
    model_update = {"target_path": str(target)}
    if settings.model.draft_path is None:
        model_update["draft_path"] = str(default_draft_dir(target))
    speculative = settings.speculative
    if "algorithm" not in speculative.model_fields_set:  # nobody chose: show the trees
        speculative = speculative.model_copy(update={"algorithm": "eagle"})
        notify(EMBEDDED_DEFAULT_NOTE)
    return settings.model_copy(
        update={"model": settings.model.model_copy(update=model_update), "speculative": speculative}
    )


def describe_checkpoint(path: str | Path) -> TargetDescription:
    """The target of checkpoint ``path`` as the container sees it, read from config.json only;
    ConfigurationError when it is missing, unreadable or of an unsupported architecture."""
    from eagletree.adapters.models.config import (
        ConfigReader,
        parse_llama_config,
        parse_mla_config,
    )
    from eagletree.adapters.models.loading import TARGET_ARCHITECTURES

    path = Path(path)
    if not path.is_dir():
        raise ConfigurationError(
            f"model.target_path = {str(path)!r} is not a directory: point it at a checkpoint "
            "(config.json + safetensors), e.g. one written by `eagletree init-random`"
        )
    reader = ConfigReader.from_dir(path)
    architecture = reader.architecture()
    if architecture not in TARGET_ARCHITECTURES:
        raise reader.error(
            f"target architecture {architecture!r} is not supported "
            f"(supported: {', '.join(TARGET_ARCHITECTURES)})"
        )
    known = TargetDescription.for_architecture(architecture)
    if architecture == "LlamaForCausalLM":
        llama = parse_llama_config(reader)
        return TargetDescription(
            architecture=architecture,
            attention_kind="mha",
            has_recurrent_layers=known.has_recurrent_layers,
            num_mtp_layers=0,
            num_layers=llama.num_hidden_layers,
            num_kv_heads=llama.num_key_value_heads,
            head_dim=llama.head_dim,
            v_head_dim=llama.head_dim,
            max_position_embeddings=llama.max_position_embeddings,
        )
    mla = parse_mla_config(reader)
    return TargetDescription(
        architecture=architecture,
        attention_kind=known.attention_kind if known.attention_kind != "mha" else "mla",
        has_recurrent_layers=known.has_recurrent_layers,
        num_mtp_layers=mla.num_nextn_predict_layers,
        num_layers=mla.num_hidden_layers,
        kv_lora_rank=mla.kv_lora_rank,
        qk_rope_head_dim=mla.qk_rope_head_dim,
        max_position_embeddings=mla.max_position_embeddings,
    )


def check_draft_path(settings: EngineSettings) -> None:
    """The draft directory, when speculation needs one, exists and has a config.json."""
    from eagletree.adapters.models.config import ConfigReader

    algorithm = settings.speculative.algorithm
    draft = settings.model.draft_path
    if algorithm == "none" or draft is None:
        return
    if not Path(draft).is_dir():
        raise ConfigurationError(
            f"model.draft_path = {draft!r} is not a directory: point it at the draft checkpoint "
            f"of speculative.algorithm = {algorithm!r}"
        )
    ConfigReader.from_dir(draft)


def check_checkpoint_shapes(target: str, draft: str | None, algorithm: Algorithm) -> None:
    """The names and shapes of the target's (and the draft's) tensors against the models their
    config.json files describe, built on the meta device: nothing is read or allocated."""
    import torch

    from eagletree.adapters.models.loading import load_models

    kind = None if algorithm == "none" else algorithm
    load_models(target, draft, kind, torch.float32, "meta", fused_kernels=False)


def check_checkpoint_values(path: str | Path) -> None:
    """The checkpoint check over every tensor of the checkpoint in ``path``, read one at a
    time on the CPU: dtypes and finite values (``config validate``; loading checks the same)."""
    import torch

    from eagletree.adapters.models.checkpoint_check import check_tensors
    from eagletree.adapters.models.tensor_files import TensorFiles

    files = TensorFiles(path)
    tensors = files.read(files.names(), torch.device("cpu"))
    check_tensors((files.file_of(name), name, tensor) for name, tensor in tensors)


def read_token_map_setting(path: str | None, vocab_size: int) -> torch.Tensor | None:
    """The ids of ``speculative.token_map`` (None when unset); errors name the setting."""
    from eagletree.adapters.models.token_map import read_token_map

    if path is None:
        return None
    try:
        return read_token_map(path, vocab_size)
    except ConfigurationError as error:
        raise ConfigurationError(f"speculative.token_map: {error}") from None


def prepare_settings(path: str | None, note: Callable[[str], None]) -> EngineSettings:
    """The settings generate and serve run: resolved, the default filled in."""
    settings = settings_for_run(load_settings(path), note)
    assert settings.model.target_path is not None  # settings_for_run fills it in
    return settings
