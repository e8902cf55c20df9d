"""Settings: typed engine settings from files and EAGLETREE_* variables; the only env reader.

The sections (``ModelSettings`` … ``ParallelSettings``) live in ``sections``.
"""

from __future__ import annotations

import os
import tomllib
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, ValidationError
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)
from pydantic_settings import SettingsError as PydanticSettingsError

from eagletree.config.sections import (
    BackendSettings,
    MemorySettings,
    ModelSettings,
    ParallelSettings,
    SchedulerSettings,
    SpeculativeSettings,
)
from eagletree.domain.errors import ConfigurationError

ENV_PREFIX = "EAGLETREE_"
ENV_NESTED_DELIMITER = "__"

# Variables with the prefix that are not settings (read by `eagletree serve`).
NON_SETTING_VARIABLES = frozenset({"EAGLETREE_API_KEY"})


class SettingsError(ConfigurationError):
    """A settings file or variable is unreadable or invalid; the message names field and value."""


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
    scheduler: SchedulerSettings = Field(default_factory=SchedulerSettings)
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
        check_environment(os.environ)
        try:
            super().__init__(**values)
        except ValidationError as error:
            raise SettingsError(describe_validation_error(error)) from None
        except PydanticSettingsError as error:  # a section variable that is not JSON
            raise SettingsError(_describe_section_variable(str(error))) from None

    @classmethod
    def from_file(cls, path: str | Path) -> EngineSettings:
        """Read a .toml, .yaml or .yml file; environment variables override its values.

        Relative checkpoint paths in the file are relative to the file's directory.
        """
        try:
            return cls(**read_settings_file(path))
        except SettingsError as error:
            if str(error).startswith("settings file"):
                raise
            raise SettingsError(f"settings file {path}: {error}") from None


PATH_FIELDS = (("model", "target_path"), ("model", "draft_path"), ("speculative", "token_map"))


def read_settings_file(path: str | Path) -> dict[str, Any]:
    """The file's mapping, unvalidated, with relative checkpoint paths made relative to the
    file's directory; SettingsError when it is missing or malformed."""
    path = Path(path)
    if path.is_dir():
        raise SettingsError(f"settings file {path} is a directory; name a .toml or .yaml file")
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
        first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise SettingsError(
            f"settings file {path} is not valid {suffix[1:]}: {first_line}"
        ) from None
    except UnicodeDecodeError:
        raise SettingsError(
            f"settings file {path} is not UTF-8 text; is it a settings file?"
        ) from None
    except OSError as error:
        raise SettingsError(f"settings file {path} cannot be read: {error.strerror}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        shown = repr(data)[:60]
        raise SettingsError(f"settings file {path} must hold a mapping of sections, not {shown}")
    return _paths_relative_to(data, path.parent)


def _paths_relative_to(data: dict[str, Any], base: Path) -> dict[str, Any]:
    data = dict(data)
    for section, name in PATH_FIELDS:
        values = data.get(section)
        if isinstance(values, dict) and isinstance(values.get(name), str):
            value = Path(values[name]).expanduser()
            if not value.is_absolute():
                data[section] = {**values, name: os.path.normpath(base / value)}
    return data


def _describe_section_variable(message: str) -> str:
    section = message.split('"')[1] if message.count('"') >= 2 else "memory"
    name = env_name(section)
    return (
        f"environment variable {name} must be a JSON object such as "
        f"{name}='{{\"page_size\": 2}}'; or set one field per variable, e.g. "
        f"{env_name(section, 'page_size' if section == 'memory' else '<field>')}=2"
    )


def check_environment(environ: Mapping[str, str]) -> None:
    """SettingsError for an EAGLETREE_* variable that names no setting (a typo is not ignored)."""
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX) or name in NON_SETTING_VARIABLES:
            continue
        parts = name[len(ENV_PREFIX) :].lower().split(ENV_NESTED_DELIMITER)
        section = EngineSettings.model_fields.get(parts[0])
        if section is None:
            sections = ", ".join(env_name(known) for known in EngineSettings.model_fields)
            raise SettingsError(
                f"environment variable {name} names no setting; sections are {sections} "
                "(unset it, or spell it EAGLETREE_<SECTION>__<FIELD>)"
            )
        fields = _known_fields(parts[:1])
        if len(parts) == 2 and parts[1] not in fields:
            raise SettingsError(
                f"environment variable {name} names no setting; known here: "
                + ", ".join(env_name(parts[0], known) for known in fields)
            )
        if len(parts) > 2:
            raise SettingsError(
                f"environment variable {name} names no setting: use "
                f"EAGLETREE_{parts[0].upper()}__<FIELD>"
            )


def env_name(*field_path: str) -> str:
    """The environment variable of a setting: env_name("memory", "page_size")."""
    return ENV_PREFIX + ENV_NESTED_DELIMITER.join(part.upper() for part in field_path)


def describe_validation_error(error: ValidationError) -> str:
    """One line per problem (a single line for one): the field, its variable, the value given
    and what is allowed."""
    lines = ["invalid settings:"]
    for problem in error.errors():
        path = [str(part) for part in problem["loc"]]
        where = ".".join(path) + f" ({env_name(*path)})"
        if problem["type"] == "extra_forbidden":
            known = _known_fields(path[:-1])
            lines.append(f"  {where}: unknown setting; known settings here: {', '.join(known)}")
            continue
        allowed = _allowed_values(path)
        if allowed:
            what = f"allowed values are {', '.join(repr(value) for value in allowed)}"
        elif problem["type"] == "string_pattern_mismatch" and path == ["model", "device"]:
            what = "allowed values are 'auto', 'cpu', 'cuda' and 'cuda:N'"
        else:
            what = problem["msg"].removeprefix("Value error, ")
        lines.append(f"  {where} = {problem['input']!r}: {what}")
    if len(lines) == 2:  # one problem: one line
        return f"{lines[0]} {lines[1].strip()}"
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
