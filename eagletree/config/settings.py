"""Settings: typed engine settings from files and EAGLETREE_* variables; the only env reader."""

from __future__ import annotations

import tomllib
import typing
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from eagletree.domain.errors import ConfigurationError

ENV_PREFIX = "EAGLETREE_"
ENV_NESTED_DELIMITER = "__"

DTypeName = Literal["bfloat16", "float16", "float32"]
AlgorithmName = Literal["none", "eagle", "eagle3", "mtp", "nextn"]
VersionName = Literal["auto", "v1", "v2"]
AttentionBackendName = Literal["torch", "triton", "flash"]
KVMoveName = Literal["torch", "triton"]
CudaGraphName = Literal["auto", "on", "off"]


class SettingsError(ConfigurationError):
    """A settings file or variable is unreadable or invalid; the message names field and value."""


class _Section(BaseModel):
    # extra="forbid": a misspelt key is an error that lists the known ones, never ignored.
    model_config = ConfigDict(frozen=True, extra="forbid")


class ModelSettings(_Section):
    target_path: str | None = Field(
        default=None, description="Target checkpoint directory (config.json + safetensors)."
    )
    draft_path: str | None = Field(
        default=None,
        description="Draft checkpoint directory; for algorithm mtp it defaults to target_path.",
    )
    dtype: DTypeName = Field(default="bfloat16", description="Weight and KV cache dtype.")
    device: str = Field(default="cuda", description='Torch device string, e.g. "cuda", "cpu".')
    max_context_len: int | None = Field(
        default=None,
        gt=0,
        description="Longest request (prompt + output); unset: the target's position limit.",
    )


class SpeculativeSettings(_Section):
    algorithm: AlgorithmName = Field(
        default="none", description="Draft algorithm; nextn is an alias of eagle."
    )
    num_steps: int | None = Field(default=None, ge=1, description="Draft depth S.")
    eagle_topk: int | None = Field(default=None, ge=1, description="Beam width k per draft step.")
    num_draft_tokens: int | None = Field(
        default=None, ge=2, description="Tree size N including the root."
    )
    version: VersionName = Field(
        default="auto", description="Worker generation; auto picks v2 unless it cannot run."
    )


class MemorySettings(_Section):
    page_size: int = Field(default=1, ge=1, description="Tokens per KV page.")
    max_total_tokens: int = Field(
        default=65_536, gt=0, description="KV slots in the shared token pool."
    )
    max_running_requests: int | None = Field(
        default=None, ge=1, description="Concurrent requests; unset: 48."
    )


class BackendSettings(_Section):
    attention: AttentionBackendName = Field(default="triton", description="Attention backend.")
    kv_move: KVMoveName = Field(default="triton", description="KV row move implementation.")
    cuda_graph: CudaGraphName = Field(
        default="auto",
        description="Capture decode steps in CUDA graphs; auto: on for CUDA, off otherwise.",
    )


class ParallelSettings(_Section):
    dp_size: int = Field(default=1, ge=1, description="Data-parallel replicas.")
    tp_size: int = Field(default=1, ge=1, description="Tensor-parallel ranks.")


class _KeywordSource(PydanticBaseSettingsSource):
    """Keyword arguments (and file contents) as plain nested dicts.

    pydantic-settings merges sources dict by dict; a section passed as a model instance would be
    replaced whole by one environment variable of that section instead of merged with it.
    """

    def __init__(self, settings_cls: type[BaseSettings], init: InitSettingsSource) -> None:
        super().__init__(settings_cls)
        self._init = init

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        return {
            key: value.model_dump() if isinstance(value, BaseModel) else value
            for key, value in self._init().items()
        }


class EngineSettings(BaseSettings):
    """Engine settings; precedence: EAGLETREE_<SECTION>__<FIELD> > file or keywords > defaults."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=ENV_NESTED_DELIMITER,
        frozen=True,
        extra="forbid",
    )

    model: ModelSettings = Field(default_factory=ModelSettings)
    speculative: SpeculativeSettings = Field(default_factory=SpeculativeSettings)
    memory: MemorySettings = Field(default_factory=MemorySettings)
    backend: BackendSettings = Field(default_factory=BackendSettings)
    parallel: ParallelSettings = Field(default_factory=ParallelSettings)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Environment first so that it overrides a file; no .env or secrets directory is read.
        assert isinstance(init_settings, InitSettingsSource)
        return env_settings, _KeywordSource(settings_cls, init_settings)

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as error:
            raise SettingsError(describe_validation_error(error)) from None

    @classmethod
    def from_file(cls, path: str | Path) -> EngineSettings:
        """Read a .toml, .yaml or .yml file; environment variables override its values."""
        return cls(**read_settings_file(path))


def read_settings_file(path: str | Path) -> dict[str, Any]:
    """The file's mapping, unvalidated; SettingsError when it is missing or malformed."""
    path = Path(path)
    if not path.is_file():
        raise SettingsError(f"settings file {path} does not exist")
    suffix = path.suffix.lower()
    try:
        if suffix == ".toml":
            with path.open("rb") as handle:
                data: object = tomllib.load(handle)
        elif suffix in (".yaml", ".yml"):
            with path.open("rb") as handle:
                data = yaml.safe_load(handle)
        else:
            raise SettingsError(
                f"settings file {path}: unknown format {suffix!r}; use .toml, .yaml or .yml"
            )
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as error:
        raise SettingsError(f"settings file {path} is not valid {suffix[1:]}: {error}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SettingsError(f"settings file {path} must hold a mapping of sections, not {data!r}")
    return data


def env_name(*field_path: str) -> str:
    """The environment variable of a setting: env_name("memory", "page_size")."""
    return ENV_PREFIX + ENV_NESTED_DELIMITER.join(part.upper() for part in field_path)


def describe_validation_error(error: ValidationError) -> str:
    """One line per problem: the field, its variable, the value given and what is allowed."""
    lines = ["invalid settings:"]
    for problem in error.errors():
        path = [str(part) for part in problem["loc"]]
        where = ".".join(path) + f" ({env_name(*path)})"
        if problem["type"] == "extra_forbidden":
            known = _known_fields(path[:-1])
            lines.append(f"  {where}: unknown setting; known settings here: {', '.join(known)}")
            continue
        allowed = _allowed_values(path)
        what = (
            f"allowed values are {', '.join(repr(value) for value in allowed)}"
            if allowed
            else problem["msg"]
        )
        lines.append(f"  {where} = {problem['input']!r}: {what}")
    return "\n".join(lines)


def _field_annotation(path: list[str]) -> Any:
    annotation: Any = EngineSettings
    for part in path:
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return None
        field = annotation.model_fields.get(part)
        if field is None:
            return None
        annotation = field.annotation
    return annotation


def _allowed_values(path: list[str]) -> tuple[object, ...]:
    annotation = _field_annotation(path)
    if typing.get_origin(annotation) is Literal:
        return typing.get_args(annotation)
    return ()


def _known_fields(path: list[str]) -> list[str]:
    annotation = _field_annotation(path)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return list(annotation.model_fields)
    return []


__all__ = [
    "BackendSettings",
    "EngineSettings",
    "MemorySettings",
    "ModelSettings",
    "ParallelSettings",
    "SettingsError",
    "SpeculativeSettings",
    "env_name",
    "read_settings_file",
]
