"""The public API: `from eagletree import ...`, Engine.generate on text, stream, close."""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from eagletree import Engine, EngineSettings, GenerationResult, SamplingParams
from eagletree.app.composition.container import build_engine
from eagletree.app.composition.run_settings import settings_for_run
from tests.fakes import fake_engine_parts, plain_engine

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    cache = tmp_path_factory.mktemp("api-cache")
    with pytest.MonkeyPatch.context() as patch:
        for name in [n for n in os.environ if n.startswith("EAGLETREE_")]:
            patch.delenv(name)
        patch.setenv("XDG_CACHE_HOME", str(cache))
        settings = settings_for_run(
            EngineSettings(memory={"max_total_tokens": 2048}), notify=lambda _: None
        )
        built = build_engine(settings)
    with built:
        yield built


def test_importing_eagletree_is_cheap_and_exports_the_api() -> None:
    code = (
        "import sys, eagletree\n"
        "assert 'torch' not in sys.modules and 'pydantic' not in sys.modules\n"
        "from eagletree import Engine, EngineSettings, GenerationResult, SamplingParams\n"
        "assert 'torch' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=120)
    assert {"Engine", "EngineSettings", "GenerationResult", "SamplingParams"} <= set(
        dir(__import__("eagletree"))
    )
    assert SamplingParams(max_new_tokens=1).greedy
    with pytest.raises(AttributeError, match="no attribute 'Engin'"):
        __import__("eagletree").Engin  # noqa: B018


def test_generate_takes_text_and_returns_text(engine: Engine) -> None:
    assert engine.tokenizer is not None
    (from_text,) = engine.generate(["The draft tree"], max_new_tokens=8)
    (from_ids,) = engine.generate([engine.tokenizer.encode("The draft tree")], max_new_tokens=8)
    assert isinstance(from_text, GenerationResult)
    assert from_text.output_ids == from_ids.output_ids
    assert from_text.prompt_ids[0] == 1  # BOS, as the checkpoint's tokenizer declares
    assert from_text.text == engine.tokenizer.decode(from_text.output_ids)


def test_a_single_string_is_refused_rather_than_split_into_characters(engine: Engine) -> None:
    with pytest.raises(ValueError, match="pass a list of prompts"):
        engine.generate("hello", max_new_tokens=2)


def test_text_that_utf8_cannot_encode_is_refused_before_it_is_tokenised(engine: Engine) -> None:
    with pytest.raises(ValueError, match=r"^request 1: the prompt is not valid UTF-8 text \("):
        engine.generate(["fine", "\ud800"], max_new_tokens=2)
    assert not engine.has_work()


def test_stream_yields_what_generate_returns_token_by_token(engine: Engine) -> None:
    prompts: list[str | list[int]] = ["The draft tree", [1, 7, 9, 11]]
    expected = engine.generate(prompts, max_new_tokens=10)
    tokens: dict[int, list[int]] = {0: [], 1: []}
    texts: dict[int, str] = {0: "", 1: ""}
    finals: dict[int, GenerationResult] = {}
    num_events = 0
    for event in engine.stream(prompts, max_new_tokens=10):
        num_events += 1
        assert event.index not in finals  # nothing after a request's last event
        tokens[event.index] += event.token_ids
        texts[event.index] += event.text
        if event.result is not None:
            assert event.finished
            finals[event.index] = event.result
    assert num_events > len(prompts)  # several steps, not one event per request
    for index, want in enumerate(expected):
        assert tokens[index] == want.output_ids == finals[index].output_ids
        assert texts[index] == want.text == finals[index].text


def test_closing_a_stream_early_aborts_its_requests_and_frees_their_slots(engine: Engine) -> None:
    allocator = engine.scheduler.allocator
    free_before = allocator.available_size()
    stream = engine.stream(["a b", "c d"], max_new_tokens=50)
    next(stream)
    assert allocator.available_size() < free_before
    stream.close()
    assert allocator.available_size() == free_before
    assert not engine.has_work()


def test_close_aborts_what_is_left_and_refuses_new_work() -> None:
    runner, allocator = fake_engine_parts(pool_size=256, row_width=64)  # no checkpoint needed
    engine = plain_engine(runner, allocator, max_context_len=48, max_running_requests=4)
    with engine:
        request = engine.submit([1, 2, 3], SamplingParams(max_new_tokens=20))
        engine.step()
    assert request.finish_reason is not None and request.finish_reason.value == "abort"
    assert engine.scheduler.allocator.available_size() == engine.scheduler.allocator.size
    with pytest.raises(RuntimeError, match="closed"):
        engine.submit([1], SamplingParams(max_new_tokens=1))


def test_the_embedding_example_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in [n for n in os.environ if n.startswith("EAGLETREE_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(sys, "argv", ["embed.py"])
    with pytest.raises(SystemExit) as exited:
        runpy.run_path(str(ROOT / "examples" / "embed.py"), run_name="__main__")
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert "streamed 12 tokens" in out
    assert out.count("first token after") == 2


def test_defaults_run_on_this_machine_given_only_a_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from eagletree.app.cli.main import main

    for name in [n for n in os.environ if n.startswith("EAGLETREE_")]:
        monkeypatch.delenv(name)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # as on a user's machine
    assert main(["init-random", "--arch", "llama", "--out", str(tmp_path)]) == 0
    settings = EngineSettings(model={"target_path": str(tmp_path / "target")})
    with build_engine(settings) as engine:
        (result,) = engine.generate([[1, 2, 3]], max_new_tokens=3)
    assert 1 <= len(result.output_ids) <= 3
    assert engine.tokenizer is None and result.text is None  # init-random writes no tokenizer


def test_init_random_can_write_a_tokenizer_that_the_engine_loads(tmp_path: Path) -> None:
    from eagletree.app.cli.main import main

    assert main(["init-random", "--arch", "llama", "--tokenizer", "--out", str(tmp_path)]) == 0
    settings = EngineSettings(
        model={"target_path": str(tmp_path / "target")}, memory={"max_total_tokens": 512}
    )
    with build_engine(settings) as engine:
        assert engine.tokenizer is not None and engine.tokenizer.has_chat_template
        (result,) = engine.generate(["tree"], max_new_tokens=2)
    assert result.text == engine.tokenizer.decode(result.output_ids)


def test_the_library_applies_the_cpu_thread_policy_where_the_engine_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    from eagletree.app.cli.main import main

    for name in [n for n in os.environ if n.startswith("EAGLETREE_")]:
        monkeypatch.delenv(name)
    assert main(["init-random", "--arch", "llama", "--out", str(tmp_path)]) == 0
    target = str(tmp_path / "target")
    before = torch.get_num_threads()
    try:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # as a user's program runs
        torch.set_num_threads(2)
        build_engine(EngineSettings(model={"target_path": target, "device": "cpu"})).close()
        assert torch.get_num_threads() == 1  # a 64-wide model: one thread
        monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the setting wins over the variable
        settings = EngineSettings(model={"target_path": target}, backend={"cpu_threads": 2})
        build_engine(settings).close()
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
