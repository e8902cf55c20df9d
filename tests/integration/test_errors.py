"""Every user mistake of docs/errors.md ends in one line naming what to change, not a traceback.

Each case prepares files or variables, runs the `eagletree` command line, and checks the exit
status, that stderr holds exactly one `error:` line (or the `warning:` line) with the expected
words, and that no traceback was printed. The ids are the rows of the tables in docs/errors.md,
with the server's bad requests (tests/integration/server/bad_requests.py).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from eagletree.app.cli.main import main
from tests.integration.server.bad_requests import SERVER_CASES

SMALL = {"EAGLETREE_MEMORY__MAX_TOTAL_TOKENS": "1024"}
TOKEN_MAP_TREE = 'algorithm = "eagle"\nnum_steps = 2\neagle_topk = 4\nnum_draft_tokens = 5\n'


@dataclass(frozen=True)
class Paths:
    tmp: Path  # this case's own directory
    checkpoint: Path  # a written llama target + eagle draft, shared: copy before changing it
    cache: Path  # XDG_CACHE_HOME holding the embedded default checkpoint


Setup = Callable[[Paths, pytest.MonkeyPatch], list[str]]


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("errors")
    assert main(["init-random", "--arch", "llama", "--draft", "eagle", "--out", str(root)]) == 0
    return root, tmp_path_factory.mktemp("errors-cache")


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


# -- the cases: id -> (setup returning argv, words the message holds) -----------------------------


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


CASES: dict[str, tuple[Setup, str]] = {
    # settings files
    "file-random-bytes-toml": (_random_bytes(".toml"), "is not UTF-8 text"),
    "file-random-bytes-yaml": (_random_bytes(".yaml"), "s.yaml"),
    "file-missing": (lambda p, m: ["config", "validate", str(p.tmp / "no.toml")], "does not exist"),
    "file-is-a-directory": (lambda p, m: ["config", "validate", str(p.tmp)], "is a directory"),
    "file-unknown-format": (_file("{}", "s.json"), "unknown format '.json'"),
    "file-bad-toml": (_file("[model\n"), "is not valid toml"),
    "file-not-a-mapping": (_file("- model\n", "s.yaml"), "must hold a mapping"),
    "file-unknown-key": (_file('[model]\ndevise = "cpu"\n'), "model.devise"),
    "page-size-true": (_file("[memory]\npage_size = true\n"), "not a boolean"),
    "requests-false": (_file("[memory]\nmax_running_requests = false\n"), "not a boolean"),
    "requests-zero": (_file("[memory]\nmax_running_requests = 0\n"), "greater than or equal"),
    "device-tpu": (_file('[model]\ndevice = "tpu"\n'), "'cuda:N'"),
    "device-meta": (_file('[model]\ndevice = "meta"\n'), "model.device"),
    "dtype-bf16": (_file('[model]\ndtype = "bf16"\n'), "allowed values are 'auto'"),
    # environment variables
    "env-section-not-json": (_variables(EAGLETREE_MEMORY="page_size=2"), "must be a JSON object"),
    "env-unknown-section": (_variables(EAGLETREE_FOO__BAR="1"), "EAGLETREE_FOO__BAR names no"),
    "env-unknown-field": (_variables(EAGLETREE_MODEL__DEVISE="cpu"), "EAGLETREE_MODEL__DEVICE"),
    "env-not-a-number": (_variables(EAGLETREE_MEMORY__PAGE_SIZE="abc"), "memory.page_size"),
    # the machine
    "flash-on-cpu": (
        _variables(EAGLETREE_MODEL__DEVICE="cpu", EAGLETREE_BACKEND__ATTENTION="flash"),
        "FlashAttention runs on CUDA only",
    ),
    "triton-attention-on-cpu": (
        _no_interpreter(EAGLETREE_BACKEND__ATTENTION="triton"),
        "backend.attention = 'triton'",
    ),
    "triton-mover-on-cpu": (
        _no_interpreter(EAGLETREE_BACKEND__KV_MOVE="triton"),
        "backend.kv_move = 'triton'",
    ),
    "cuda-graph-on-cpu": (
        _variables(EAGLETREE_MODEL__DEVICE="cpu", EAGLETREE_BACKEND__CUDA_GRAPH="on"),
        "backend.cuda_graph = 'on'",
    ),
    # checkpoints
    "target-missing-validate": (
        _with_target("", "validate", target="nowhere"),
        "model.target_path",
    ),
    "target-missing-generate": (
        _with_target("", "generate", target="nowhere"),
        "model.target_path",
    ),
    "target-no-config": (_corrupt_config_removed, "no config.json"),
    "target-config-empty": (_config_edit(lambda t: "", "validate"), "not valid JSON"),
    "target-config-not-json": (_config_edit(lambda t: t[:40], "generate"), "config.json"),
    "target-unsupported-validate": (
        _config_edit(_as_gpt2),
        "'GPT2LMHeadModel' is not supported",
    ),
    "target-unsupported-generate": (
        _config_edit(_as_gpt2, "generate"),
        "'GPT2LMHeadModel' is not supported",
    ),
    "draft-missing": (
        _with_target('draft_path = "nowhere"\n[speculative]\nalgorithm = "eagle"\n', "validate"),
        "model.draft_path",
    ),
    "context-too-long-validate": (
        _with_target("max_context_len = 100000\n", "validate"),
        "exceeds the target's max_position_embeddings",
    ),
    "context-too-long-generate": (
        _with_target("max_context_len = 100000\n", "generate"),
        "exceeds the target's max_position_embeddings",
    ),
    "token-map-missing": (
        _token_map(None, TOKEN_MAP_TREE, "validate"),
        "speculative.token_map: token map",
    ),
    "token-map-for-eagle3": (
        _token_map([1, 2, 3, 4], 'algorithm = "eagle3"\n', "validate"),
        "unset speculative.token_map",
    ),
    "token-map-below-topk-generate": (
        _token_map([1, 2, 3], TOKEN_MAP_TREE, "generate"),
        "speculative.eagle_topk = 4 exceeds the 3 tokens the draft proposes from",
    ),
    "topk-above-vocab-validate": (
        _with_target(
            'draft_path = "{draft}"\n[speculative]\nalgorithm = "eagle"\nnum_steps = 1\n'
            "eagle_topk = 600\nnum_draft_tokens = 2\n",
            "validate",
        ),
        "speculative.eagle_topk = 600 exceeds the target vocabulary",
    ),
    "safetensors-truncated": (
        _corrupt_file("model.safetensors", b"", truncate=True),
        "not a readable safetensors file",
    ),
    "safetensors-random-bytes": (
        _corrupt_file("model.safetensors", os.urandom(4096)),
        "not a readable safetensors file",
    ),
    "checkpoint-int-weights-generate": (
        _tensor_edit(lambda t: (t * 100).to(torch.int32), "generate"),
        "tensor 'model.layers.0.mlp.down_proj.weight' is int32, but eagletree loads weights",
    ),
    "checkpoint-int-weights-validate": (
        _tensor_edit(lambda t: (t * 100).to(torch.int32), "validate"),
        "target/model.safetensors: tensor 'model.layers.0.mlp.down_proj.weight' is int32",
    ),
    "checkpoint-nan-generate": (
        _tensor_edit(_with_nan, "generate"),
        "tensor 'model.layers.0.mlp.down_proj.weight' holds NaN or infinite values",
    ),
    "checkpoint-nan-validate": (
        _tensor_edit(_with_nan, "validate"),
        "target/model.safetensors: tensor 'model.layers.0.mlp.down_proj.weight' holds NaN",
    ),
    "checkpoint-shape-generate": (
        _tensor_edit(lambda t: t[:, :64].contiguous(), "generate"),
        "tensor 'model.layers.0.mlp.down_proj.weight' has shape [64, 64], the "
        "LlamaForCausalLM target expects [64, 128]",
    ),
    "checkpoint-shape-validate": (
        _tensor_edit(lambda t: t[:, :64].contiguous(), "validate"),
        "tensor 'model.layers.0.mlp.down_proj.weight' has shape [64, 64], the "
        "LlamaForCausalLM target expects [64, 128]",
    ),
    "generation-config-corrupt": (
        _corrupt_file("generation_config.json", b"{not json"),
        "generation_config.json is not valid JSON",
    ),
    "tokenizer-corrupt-with-prompt-ids": (_tokenizer(broken=True), "tokenizer files"),
    "chat-without-template": (_tokenizer(broken=False), "no chat template"),
    "cache-unwritable": (_unwritable_cache, "cannot create the default checkpoint"),
    # generate flags
    "text-without-tokenizer": (
        _generate_flags("--prompt", "hello", text_prompt=True),
        "needs the checkpoint's tokenizer",
    ),
    "max-new-tokens-zero": (_generate_flags("--max-new-tokens", "0"), "--max-new-tokens must"),
    "prompt-ids-not-ints": (_generate_flags("--prompt-ids", "1 x"), "token id 'x'"),
    "prompt-ids-outside-vocab": (_generate_flags("--prompt-ids", "99999"), "outside the vocab"),
    "chat-without-prompt": (_generate_flags("--chat", "--prompt-ids", "1"), "--chat applies"),
    "prompts-file-missing": (_prompts_file(None), "does not exist"),
    "prompts-file-bad-json": (_prompts_file('{"prompt": "a"}\n{oops\n'), "prompts.jsonl:2"),
    "prompts-file-bad-shape": (_prompts_file('{"text": "a"}\n'), 'expected {"prompt"'),
    "prompts-file-unknown-key": (
        _prompts_file('{"prompt": "a", "max_new_tokens": 4}\n'),
        "prompts.jsonl:1: unknown key 'max_new_tokens'",
    ),
    "prompts-file-not-utf8": (
        _prompts_file_bytes(b'{"prompt": "\xff"}\n'),
        "cannot be read as UTF-8 text",
    ),
    "prompts-file-lone-surrogate": (
        _prompts_file('{"prompt": "a\\ud800"}\n'),
        'prompts.jsonl:1: "prompt" is not valid UTF-8 text (a lone surrogate \\ud800 at',
    ),
    "prompt-not-utf8": (
        _generate_flags("--prompt", "ok", "--prompt", "caf\udcff"),  # bytes b"caf\xff" in argv
        "--prompt #2 is not valid UTF-8 text (the byte 0xff at character 3)",
    ),
    "temperature-negative": (
        _flags_before_loading("--temperature", "-1"),
        "--temperature must be >= 0 (0: greedy), got -1.0",
    ),
    "top-p-zero": (_flags_before_loading("--top-p", "0"), "--top-p must be in (0, 1], got 0.0"),
    "config-two-files": (_two_settings_files, "config show got two settings files"),
    # init-random
    "init-negative-size": (_init_random("--arch", "llama", "--hidden-size", "-8"), "at least 1"),
    "init-zero-layers": (_init_random("--arch", "llama", "--num-layers", "0"), "--num-layers 0"),
    "init-odd-head-dim": (_init_random("--arch", "llama", "--head-dim", "7"), "must be even"),
    "init-odd-rope-dim": (
        _init_random("--arch", "deepseek-mla", "--qk-rope-head-dim", "5"),
        "--qk-rope-head-dim 5",
    ),
    "init-kv-heads": (_init_random("--arch", "llama", "--num-kv-heads", "3"), "not a multiple"),
    "init-out-is-a-file": (_init_random("--arch", "llama", out_is_file=True), "is a file"),
    "init-llama-mtp": (_init_random("--arch", "llama", "--draft", "mtp"), "--arch deepseek-mla"),
    "init-draft-vocab": (
        _init_random("--arch", "llama", "--draft", "eagle3", "--draft-vocab-size", "9999"),
        "exceeds --vocab-size",
    ),
    "init-tokenizer-small-vocab": (
        _init_random("--arch", "llama", "--tokenizer", "--vocab-size", "100"),
        "--tokenizer needs --vocab-size >= 259",
    ),
    "init-device-missing-cuda": (
        _init_random("--arch", "llama", "--device", "cuda:99"),
        "--device cuda:99 but",
    ),
    "init-device-unknown": (_init_random("--arch", "llama", "--device", "tpu"), "is not a device"),
    "init-too-large": (
        _init_random("--arch", "llama", "--vocab-size", "100000000", "--hidden-size", "1000000"),
        "error: the checkpoint of these sizes",  # memory, or else the disk, is short
    ),
    # train-draft and token-map
    "train-seq-len-above-positions": (
        _train("--seq-len", "100000"),
        "--seq-len = 100000 exceeds the target's max_position_embeddings (4096)",
    ),
    "train-without-tokenizer": (_train(), "vocabulary of 512 ids is not the 256 bytes"),
    "token-map-without-tokenizer": (
        _train(command="token-map"),
        "has no tokenizer (tokenizer.json or tokenizer.model beside config.json)",
    ),
    # serve
    "serve-bad-port": (lambda p, m: ["serve", "--port", "70000"], "is not a TCP port"),
    "serve-max-tokens-limit-zero": (
        lambda p, m: ["serve", "--max-tokens-limit", "0"],
        "--max-tokens-limit 0: must be at least 1",
    ),
}


WARNINGS: dict[str, tuple[Setup, str]] = {
    "top-k-with-greedy": (_generate_flags("--top-k", "5"), "--top-k has no effect"),
    "seed-with-greedy": (_generate_flags("--seed", "5"), "--seed has no effect"),
}


@pytest.fixture
def paths(shared: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Paths:
    for name in [n for n in os.environ if n.startswith("EAGLETREE_")]:
        monkeypatch.delenv(name)
    env(monkeypatch, **SMALL)
    monkeypatch.setenv("XDG_CACHE_HOME", str(shared[1]))
    monkeypatch.chdir(tmp_path)
    return Paths(tmp_path, shared[0], shared[1])


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_mistake_is_one_line_naming_what_to_change(
    case: str, paths: Paths, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    setup, words = CASES[case]
    argv = setup(paths, monkeypatch)
    status = main(argv)
    err = capfd.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert status == 1, err
    assert len(errors) == 1, err
    assert words in errors[0], err
    assert "Traceback" not in err


@pytest.mark.parametrize("case", sorted(WARNINGS))
def test_an_ignored_flag_is_a_warning(
    case: str, paths: Paths, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    setup, words = WARNINGS[case]
    status = main(setup(paths, monkeypatch))
    err = capfd.readouterr().err
    assert status == 0, err
    assert any(line.startswith("warning:") and words in line for line in err.splitlines()), err


def test_the_table_in_the_docs_lists_every_case() -> None:
    table = (Path(__file__).resolve().parents[2] / "docs" / "errors.md").read_text()
    rows = {line.split("|")[1].strip().strip("`") for line in table.splitlines() if "| `" in line}
    assert set(CASES) | set(WARNINGS) | set(SERVER_CASES) == rows
    assert len(CASES) >= 40


def test_device_cpu_alone_runs_with_the_torch_backends(
    paths: Paths, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("EAGLETREE_MODEL__DEVICE", "cpu")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # as on a user's machine
    settings = target_settings(paths, paths.checkpoint / "target")
    assert main(generate(settings)) == 0, capfd.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_cuda_without_cuda_is_an_error_naming_the_setting(
    paths: Paths, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("EAGLETREE_MODEL__DEVICE", "cuda")
    assert main(["config", "validate"]) == 1
    assert "model.device = 'cuda' but no CUDA device is visible" in capfd.readouterr().err
