"""Tests of the typed settings: files, environment precedence and error messages."""

from __future__ import annotations

import os
import typing
from pathlib import Path

import pydantic
import pytest
from pydantic import BaseModel

from eagletree.config.eagle_hook import resolve_speculative
from eagletree.config.sections import MemorySettings
from eagletree.config.settings import EngineSettings, SettingsError, env_name, read_settings_file
from eagletree.config.target import TargetDescription
from eagletree.domain.errors import ConfigurationError

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((REPO / "examples").glob("*.[ty]*ml"))
# The examples name their target in a comment; mtp needs one with MTP layers.
EXAMPLE_TARGETS = {"mtp.toml": "DeepseekV3ForCausalLM"}


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in os.environ:
        if name.startswith("EAGLETREE_"):
            monkeypatch.delenv(name)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def all_settings() -> list[tuple[str, str]]:
    """(section, field) for every setting."""
    return [
        (section, name)
        for section, info in EngineSettings.model_fields.items()
        for name in typing.cast(type[BaseModel], info.annotation).model_fields
    ]


def test_defaults_describe_a_plain_decoder() -> None:
    settings = EngineSettings()
    assert settings.speculative.algorithm == "none"
    assert settings.memory.page_size == 1
    # the machine decides (app/composition/platform.py): CUDA, bf16 and Triton, or CPU, fp32, torch
    assert (settings.model.device, settings.model.dtype) == ("auto", "auto")
    assert (settings.backend.attention, settings.backend.kv_move) == ("auto", "auto")


def test_a_toml_file_is_read(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "s.toml",
        '[speculative]\nalgorithm = "eagle"\nnum_steps = 2\n[memory]\npage_size = 2\n',
    )
    settings = EngineSettings.from_file(path)
    assert settings.speculative.algorithm == "eagle"
    assert settings.speculative.num_steps == 2
    assert settings.memory.page_size == 2
    assert settings.memory.max_total_tokens == MemorySettings().max_total_tokens


@pytest.mark.parametrize("suffix", [".yaml", ".yml"])
def test_a_yaml_file_is_read(tmp_path: Path, suffix: str) -> None:
    path = write(
        tmp_path, "s" + suffix, "speculative:\n  eagle_topk: 3\nbackend:\n  kv_move: torch\n"
    )
    settings = EngineSettings.from_file(path)
    assert settings.speculative.eagle_topk == 3
    assert settings.backend.kv_move == "torch"


def test_the_yaml_example_says_what_the_toml_example_says() -> None:
    toml = EngineSettings.from_file(REPO / "examples" / "tiny-tree.toml")
    yaml = EngineSettings.from_file(REPO / "examples" / "tiny-tree.yaml")
    assert toml == yaml


@pytest.mark.parametrize("path", EXAMPLES, ids=[path.name for path in EXAMPLES])
def test_every_example_loads_and_resolves(path: Path) -> None:
    settings = EngineSettings.from_file(path)
    target = TargetDescription.for_architecture(EXAMPLE_TARGETS.get(path.name, "LlamaForCausalLM"))
    resolved = resolve_speculative(settings, target)
    assert resolved.enabled
    assert resolved.version == ("v1" if path.name == "paged-v1.toml" else "v2")


def test_the_examples_cover_tree_chain_mtp_and_paged() -> None:
    names = {path.name for path in EXAMPLES}
    assert {"tiny-tree.toml", "tiny-tree.yaml", "chain.toml", "mtp.toml", "paged-v1.toml"} <= names
    assert (
        EngineSettings.from_file(REPO / "examples" / "tiny-tree.toml").speculative.eagle_topk == 4
    )
    assert EngineSettings.from_file(REPO / "examples" / "chain.toml").speculative.eagle_topk == 1
    assert EngineSettings.from_file(REPO / "examples" / "paged-v1.toml").memory.page_size == 4


def test_the_environment_overrides_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path, "s.toml", "[memory]\npage_size = 1\nmax_total_tokens = 999\n")
    monkeypatch.setenv("EAGLETREE_MEMORY__PAGE_SIZE", "4")
    settings = EngineSettings.from_file(path)
    assert settings.memory.page_size == 4  # env > file
    assert settings.memory.max_total_tokens == 999  # file > default, kept beside the env value
    assert settings.memory.max_running_requests is None  # default


def test_the_environment_overrides_keyword_sections_field_by_field(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("EAGLETREE_MEMORY__PAGE_SIZE", "8")
    settings = EngineSettings(memory=MemorySettings(max_total_tokens=123))
    assert settings.memory == MemorySettings(page_size=8, max_total_tokens=123)


def test_environment_alone_configures_every_section(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EAGLETREE_SPECULATIVE__ALGORITHM", "eagle3")
    monkeypatch.setenv("EAGLETREE_BACKEND__CUDA_GRAPH", "off")
    monkeypatch.setenv("EAGLETREE_PARALLEL__TP_SIZE", "2")
    monkeypatch.setenv("EAGLETREE_MODEL__DRAFT_PATH", "/d")
    monkeypatch.setenv("EAGLETREE_SCHEDULER__OVERLAP", "on")
    settings = EngineSettings()
    assert settings.speculative.algorithm == "eagle3"
    assert settings.backend.cuda_graph == "off"
    assert settings.scheduler.overlap == "on"
    assert settings.parallel.tp_size == 2
    assert settings.model.draft_path == "/d"


def test_a_typo_in_a_file_names_the_field_the_value_and_the_choices(tmp_path: Path) -> None:
    path = write(tmp_path, "s.toml", '[backend]\nattention = "trition"\n')
    with pytest.raises(SettingsError) as raised:
        EngineSettings.from_file(path)
    assert (
        "backend.attention (EAGLETREE_BACKEND__ATTENTION) = 'trition': "
        "allowed values are 'auto', 'torch', 'triton', 'flash'"
    ) in str(raised.value)


def test_a_typo_in_the_environment_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EAGLETREE_SPECULATIVE__VERSION", "v3")
    with pytest.raises(SettingsError) as raised:
        EngineSettings()
    assert (
        "speculative.version (EAGLETREE_SPECULATIVE__VERSION) = 'v3': "
        "allowed values are 'auto', 'v1', 'v2'"
    ) in str(raised.value)


def test_prefill_step_takes_with_decode_or_alone_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert EngineSettings().scheduler.prefill_step == "with_decode"
    monkeypatch.setenv("EAGLETREE_SCHEDULER__PREFILL_STEP", "alone")
    assert EngineSettings().scheduler.prefill_step == "alone"
    monkeypatch.setenv("EAGLETREE_SCHEDULER__PREFILL_STEP", "separate")
    with pytest.raises(SettingsError) as raised:
        EngineSettings()
    assert (
        "scheduler.prefill_step (EAGLETREE_SCHEDULER__PREFILL_STEP) = 'separate': "
        "allowed values are 'with_decode', 'alone'"
    ) in str(raised.value)


def test_a_misspelt_key_lists_the_known_ones(tmp_path: Path) -> None:
    path = write(tmp_path, "s.yaml", "speculative:\n  eagle_top_k: 4\n")
    with pytest.raises(SettingsError) as raised:
        EngineSettings.from_file(path)
    assert (
        "speculative.eagle_top_k (EAGLETREE_SPECULATIVE__EAGLE_TOP_K): unknown setting; known "
        "settings here: algorithm, num_steps, eagle_topk, num_draft_tokens, version"
    ) in str(raised.value)


def test_a_misspelt_section_lists_the_sections() -> None:
    with pytest.raises(SettingsError, match="known settings here: model, speculative, memory"):
        EngineSettings(memroy={"page_size": 2})


def test_every_problem_of_a_file_is_reported_at_once(tmp_path: Path) -> None:
    path = write(tmp_path, "s.toml", '[memory]\npage_size = 0\n[model]\ndtype = "bf16"\n')
    with pytest.raises(SettingsError) as raised:
        EngineSettings.from_file(path)
    message = str(raised.value)
    assert "memory.page_size (EAGLETREE_MEMORY__PAGE_SIZE) = 0: " in message
    assert "greater than or equal to 1" in message
    assert (
        "model.dtype (EAGLETREE_MODEL__DTYPE) = 'bf16': allowed values are 'auto', 'bfloat16'"
        in message
    )


def test_a_wrongly_typed_value_names_the_field(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EAGLETREE_SPECULATIVE__NUM_STEPS", "three")
    with pytest.raises(SettingsError, match=r"speculative.num_steps .* = 'three': .*integer"):
        EngineSettings()


def test_settings_errors_are_configuration_errors() -> None:
    assert issubclass(SettingsError, ConfigurationError)
    assert issubclass(SettingsError, ValueError)


def test_settings_are_frozen() -> None:
    settings = EngineSettings()
    with pytest.raises(pydantic.ValidationError):
        settings.memory.page_size = 2
    with pytest.raises(pydantic.ValidationError):
        settings.memory = MemorySettings()


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("missing.toml", None, "does not exist"),
        ("s.json", "{}", "unknown format '.json'; use .toml, .yaml or .yml"),
        ("s.toml", "[memory\n", "is not valid toml"),
        ("s.yaml", "memory: [1, 2\n", "is not valid yaml"),
        ("s.yaml", "- 1\n- 2\n", "must hold a mapping of sections"),
    ],
)
def test_an_unreadable_file_is_a_settings_error(
    tmp_path: Path, name: str, text: str | None, message: str
) -> None:
    path = tmp_path / name if text is None else write(tmp_path, name, text)
    with pytest.raises(SettingsError, match=message.replace("(", r"\(").replace(".", r"\.")):
        EngineSettings.from_file(path)


def test_an_empty_yaml_file_means_the_defaults(tmp_path: Path) -> None:
    assert read_settings_file(write(tmp_path, "s.yaml", "")) == {}
    assert EngineSettings.from_file(tmp_path / "s.yaml") == EngineSettings()


def test_environment_names_follow_the_prefix_and_nesting() -> None:
    assert env_name("memory", "page_size") == "EAGLETREE_MEMORY__PAGE_SIZE"


def test_every_setting_is_documented_with_its_environment_name() -> None:
    docs = (REPO / "docs" / "configuration.md").read_text()
    missing = [
        env_name(section, name)
        for section, name in all_settings()
        if env_name(section, name) not in docs or f"`{section}.{name}`" not in docs
    ]
    assert missing == []
