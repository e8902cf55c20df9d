"""How each user mistake of docs/errors.md is prepared: the directories a case works
in, and builders of setups that write files or set variables and return the
`eagletree` command line to run."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch


@dataclass(frozen=True)
class Paths:
    tmp: Path  # this case's own directory
    checkpoint: Path  # a written llama target + eagle draft, shared: copy before changing it
    cache: Path  # XDG_CACHE_HOME holding the embedded default checkpoint


Setup = Callable[[Paths, pytest.MonkeyPatch], list[str]]


def settings_file(paths: Paths, text: str, name: str = "s.toml") -> str:
    file = paths.tmp / name
    file.write_text(text)
    return str(file)


def own_target(paths: Paths) -> Path:
    """A copy of the shared target this case may break."""
    target = paths.tmp / "target"
    shutil.copytree(paths.checkpoint / "target", target)
    return target


def target_settings(paths: Paths, target: Path, extra: str = "") -> str:
    return settings_file(paths, f'[model]\ntarget_path = "{target}"\n{extra}')


def generate(settings: str, *more: str) -> list[str]:
    return ["generate", "--settings", settings, "--prompt-ids", "1 2", "--max-new-tokens", "2",
            "--no-progress", *more]  # fmt: skip


def env(monkeypatch: pytest.MonkeyPatch, **values: str) -> None:
    for name, value in values.items():
        monkeypatch.setenv(name, value)


def _random_bytes(suffix: str) -> Setup:
    def setup(p: Paths, m: pytest.MonkeyPatch) -> list[str]:
        file = p.tmp / f"s{suffix}"
        file.write_bytes(bytes(range(128, 256)) * 4)
        return ["config", "validate", str(file)]

    return setup


def _file(text: str, name: str = "s.toml") -> Setup:
    return lambda p, m: ["config", "validate", settings_file(p, text, name)]


def _variables(**values: str) -> Setup:
    def setup(p: Paths, m: pytest.MonkeyPatch) -> list[str]:
        env(m, **values)
        return ["config", "validate"]

    return setup


def _corrupt_file(name: str, content: bytes, truncate: bool = False) -> Setup:
    def setup(p: Paths, m: pytest.MonkeyPatch) -> list[str]:
        target = own_target(p)
        file = target / name
        file.write_bytes(file.read_bytes()[:200] if truncate else content)
        return generate(target_settings(p, target))

    return setup


def _config_edit(edit: Callable[[str], str], command: str = "validate") -> Setup:
    def setup(p: Paths, m: pytest.MonkeyPatch) -> list[str]:
        target = own_target(p)
        config = target / "config.json"
        config.write_text(edit(config.read_text()))
        settings = target_settings(p, target)
        return ["config", "validate", settings] if command == "validate" else generate(settings)

    return setup


def _with_target(extra: str, command: str, target: str | None = None) -> Setup:
    """Settings naming the shared target (or ``target``); ``{draft}`` in ``extra`` is its draft."""

    def setup(p: Paths, m: pytest.MonkeyPatch) -> list[str]:
        path = p.checkpoint / "target" if target is None else p.tmp / target
        settings = target_settings(p, path, extra.format(draft=p.checkpoint / "draft"))
        return ["config", "validate", settings] if command == "validate" else generate(settings)

    return setup


def _token_map(ids: list[int] | None, speculative: str, command: str) -> Setup:
    """Settings with ``speculative.token_map = "map.json"`` beside them (None: no such file)."""

    def setup(p: Paths, m: pytest.MonkeyPatch) -> list[str]:
        if ids is not None:
            (p.tmp / "map.json").write_text(json.dumps(ids))
        extra = f'draft_path = "{p.checkpoint / "draft"}"\n[speculative]\n{speculative}'
        settings = target_settings(p, p.checkpoint / "target", extra + 'token_map = "map.json"\n')
        return ["config", "validate", settings] if command == "validate" else generate(settings)

    return setup


def _tokenizer(broken: bool) -> Setup:
    def setup(p: Paths, m: pytest.MonkeyPatch) -> list[str]:
        from eagletree.adapters.text.byte_tokenizer import write_byte_level_tokenizer

        target = own_target(p)
        write_byte_level_tokenizer(target, 512)
        if broken:
            (target / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": 3')
            return generate(target_settings(p, target))
        config = target / "tokenizer_config.json"
        config.write_text(config.read_text().replace('"chat_template"', '"unused_template"'))
        settings = target_settings(p, target)
        return ["generate", "--settings", settings, "--chat", "--prompt", "hi", "--no-progress"]

    return setup


def _generate_flags(*flags: str, text_prompt: bool = False) -> Setup:
    def setup(p: Paths, m: pytest.MonkeyPatch) -> list[str]:
        if text_prompt:  # the shared checkpoint has no tokenizer
            settings = target_settings(p, p.checkpoint / "target")
            return ["generate", "--settings", settings, "--no-progress", *flags]
        return ["generate", "--no-progress", "--max-new-tokens", "2", *flags]

    return setup


def _prompts_file(text: str | None) -> Setup:
    def setup(p: Paths, m: pytest.MonkeyPatch) -> list[str]:
        file = p.tmp / "prompts.jsonl"
        if text is not None:
            file.write_text(text)
        return ["generate", "--prompts-file", str(file), "--no-progress"]

    return setup


def _init_random(*flags: str, out_is_file: bool = False) -> Setup:
    def setup(p: Paths, m: pytest.MonkeyPatch) -> list[str]:
        out = p.tmp / "out"
        if out_is_file:
            out.write_text("not a directory")
        return ["init-random", "--out", str(out), *flags]

    return setup


def _tensor_edit(edit: Callable[[torch.Tensor], torch.Tensor], command: str) -> Setup:
    """A copy of the shared target whose down_proj of layer 0 is ``edit``ed."""

    def setup(p: Paths, m: pytest.MonkeyPatch) -> list[str]:
        from safetensors.torch import load_file, save_file

        target = own_target(p)
        file = target / "model.safetensors"
        tensors = load_file(file)
        name = "model.layers.0.mlp.down_proj.weight"
        tensors[name] = edit(tensors[name])
        save_file(tensors, file)
        settings = target_settings(p, target)
        return ["config", "validate", settings] if command == "validate" else generate(settings)

    return setup


def _with_nan(tensor: torch.Tensor) -> torch.Tensor:
    tensor = tensor.clone()
    tensor[0, 0] = float("nan")
    return tensor


def _prompts_file_bytes(content: bytes) -> Setup:
    def setup(p: Paths, m: pytest.MonkeyPatch) -> list[str]:
        file = p.tmp / "prompts.jsonl"
        file.write_bytes(content)
        return ["generate", "--prompts-file", str(file), "--no-progress"]

    return setup


def _flags_before_loading(*flags: str) -> Setup:
    """generate with ``flags`` on settings naming no checkpoint: a flag checked after loading
    would end in the missing-target error instead."""

    def setup(p: Paths, m: pytest.MonkeyPatch) -> list[str]:
        return generate(target_settings(p, p.tmp / "nowhere"), *flags)

    return setup


def _train(*flags: str, command: str = "train-draft") -> Setup:
    def setup(p: Paths, m: pytest.MonkeyPatch) -> list[str]:
        data = p.tmp / "corpus.txt"
        data.write_text("the draft tree " * 200)
        target = ["--target", str(p.checkpoint / "target"), "--data", str(data)]
        if command == "token-map":
            return ["token-map", *target, "--out", str(p.tmp / "map.pt")]
        out = ["--out", str(p.tmp / "head"), "--algorithm", "eagle", "--device", "cpu"]
        return ["train-draft", *target, *out, "--max-steps", "1", *flags]

    return setup


def _two_settings_files(p: Paths, m: pytest.MonkeyPatch) -> list[str]:
    first, second = settings_file(p, "", "a.toml"), settings_file(p, "", "b.toml")
    return ["config", "show", first, "--settings", second]


def _corrupt_config_removed(p: Paths, m: pytest.MonkeyPatch) -> list[str]:
    target = own_target(p)
    (target / "config.json").unlink()
    return ["config", "validate", target_settings(p, target)]


def _unwritable_cache(p: Paths, m: pytest.MonkeyPatch) -> list[str]:
    blocker = p.tmp / "cache-is-a-file"
    blocker.write_text("")
    m.setenv("XDG_CACHE_HOME", str(blocker))
    return ["generate", "--no-progress"]


def _no_interpreter(**values: str) -> Setup:
    def setup(p: Paths, m: pytest.MonkeyPatch) -> list[str]:
        m.delenv("TRITON_INTERPRET", raising=False)
        env(m, EAGLETREE_MODEL__DEVICE="cpu", **values)
        return ["config", "validate"]

    return setup


def _as_gpt2(config: str) -> str:
    values = json.loads(config)
    values["architectures"] = ["GPT2LMHeadModel"]
    return json.dumps(values)
