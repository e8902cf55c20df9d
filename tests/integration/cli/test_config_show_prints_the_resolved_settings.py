"""`eagletree config show` through the entry point: what generate runs as parseable
TOML, the target, the resolved speculation and its fallback, overlap and CPU threads,
the environment, and the settings file given either way."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import torch

from eagletree.app.cli.main import main
from tests.integration.cli.commands import EXAMPLES, show


def test_show_prints_what_generate_runs_without_a_file_as_parseable_toml(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    shown = show(capsys)
    # the embedded default: its checkpoint, EAGLE on its draft head, the machine's device
    assert shown["model"]["target_path"].startswith(str(tmp_path / "eagletree"))
    assert shown["speculative"]["algorithm"] == "eagle"
    assert shown["speculative"]["resolved"]["worker"] == "eagle_v2"
    on_cuda = torch.cuda.is_available()
    assert shown["model"]["device"] == ("cuda" if on_cuda else "cpu")
    assert shown["model"]["dtype"] == ("bfloat16" if on_cuda else "float32")
    assert shown["backend"]["attention"] == shown["backend"]["kv_move"]
    assert shown["backend"]["attention"] == ("triton" if on_cuda else "torch")
    assert shown["backend"]["cuda_graph"] == ("on" if on_cuda else "off")
    assert shown["memory"]["page_size"] == 1
    assert shown["memory"]["debug_checks"] is False
    assert shown["scheduler"]["overlap"] == "auto"
    assert shown["scheduler"]["prefill_step"] == "with_decode"
    assert shown["target"]["architecture"] == "LlamaForCausalLM"
    monkeypatch.setenv("EAGLETREE_SCHEDULER__PREFILL_STEP", "alone")
    assert show(capsys)["scheduler"]["prefill_step"] == "alone"


def test_show_says_whether_the_engine_overlaps_and_why_not(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("EAGLETREE_MODEL__DEVICE", "cpu")
    assert main(["config", "show"]) == 0
    header = capsys.readouterr().out
    assert "overlap off" in header and "nothing to overlap" in header  # the CPU, on auto
    monkeypatch.setenv("EAGLETREE_SCHEDULER__OVERLAP", "on")
    assert main(["config", "show"]) == 0
    assert "overlap on" in capsys.readouterr().out
    monkeypatch.setenv("EAGLETREE_SPECULATIVE__VERSION", "v1")
    assert main(["config", "show"]) == 1
    assert "scheduler.overlap = 'on' cannot be kept: the eagle_v1 worker" in capsys.readouterr().err


def test_show_reads_the_target_from_the_checkpoint_when_given(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["init-random", "--arch", "deepseek-mla", "--out", str(tmp_path / "c")]) == 0
    settings = tmp_path / "s.toml"
    settings.write_text('[model]\ntarget_path = "c/target"\n')
    capsys.readouterr()
    shown = show(capsys, "--settings", str(settings))
    assert shown["model"]["target_path"] == str(tmp_path / "c" / "target")  # relative to the file
    assert shown["speculative"]["resolved"]["worker"] == "none"
    target = shown["target"]
    assert (target["architecture"], target["attention_kind"]) == ("DeepseekV3ForCausalLM", "mla")
    assert (target["num_layers"], target["kv_lora_rank"], target["num_mtp_layers"]) == (4, 32, 0)


def test_show_prints_the_v1_fallback_and_its_reason(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "show", "--settings", str(EXAMPLES / "paged-v1.toml")]) == 0
    captured = capsys.readouterr()
    resolved = tomllib.loads(captured.out)["speculative"]["resolved"]
    assert resolved["version"] == "v1"
    assert resolved["worker"] == "eagle_v1"
    assert resolved["fallback_reason"].startswith(
        "speculative.eagle_topk = 4 with memory.page_size = 4"
    )
    assert "[speculative.resolved]" in captured.out
    assert any("falls back to v1" in warning for warning in resolved["warnings"])


def test_show_resolves_a_tree_on_v2(capsys: pytest.CaptureFixture[str]) -> None:
    resolved = show(capsys, "--settings", str(EXAMPLES / "tiny-tree.yaml"))["speculative"][
        "resolved"
    ]
    assert (resolved["num_steps"], resolved["topk"], resolved["num_draft_tokens"]) == (3, 4, 8)
    assert (resolved["version"], resolved["worker"]) == ("v2", "eagle_v2")
    assert "fallback_reason" not in resolved


def test_show_takes_the_target_architecture(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    shown = show(
        capsys, "--settings", str(EXAMPLES / "mtp.toml"), "--target-arch", "DeepseekV3ForCausalLM"
    )
    assert shown["target"]["attention_kind"] == "mla"
    assert shown["speculative"]["resolved"]["draft_path"] == shown["model"]["draft_path"]
    # without a draft path, mtp drafts with the target checkpoint's own MTP layers
    settings = tmp_path / "mtp.toml"
    settings.write_text('[model]\ntarget_path = "ckpt"\n[speculative]\nalgorithm = "mtp"\n')
    shown = show(capsys, "--settings", str(settings), "--target-arch", "DeepseekV3ForCausalLM")
    assert shown["speculative"]["resolved"]["draft_path"] == str(tmp_path / "ckpt")


def test_show_takes_an_attention_kind(capsys: pytest.CaptureFixture[str]) -> None:
    assert show(capsys, "--attention-kind", "dsa")["target"]["attention_kind"] == "dsa"


def test_show_includes_the_environment(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EAGLETREE_MEMORY__PAGE_SIZE", "2")
    assert show(capsys, "--settings", str(EXAMPLES / "chain.toml"))["memory"]["page_size"] == 2


def test_show_with_a_bad_environment_fails_cleanly(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EAGLETREE_SPECULATIVE__ALGORITHM", "medusa")
    assert main(["config", "show"]) == 1
    assert "speculative.algorithm (EAGLETREE_SPECULATIVE__ALGORITHM) = 'medusa'" in (
        capsys.readouterr().err
    )


def test_show_says_how_many_cpu_threads_the_engine_will_run(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert main(["init-random", "--arch", "llama", "--out", str(tmp_path)]) == 0
    settings = tmp_path / "s.toml"
    settings.write_text('[model]\ntarget_path = "target"\ndevice = "cpu"\n')
    capsys.readouterr()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert main(["config", "show", str(settings)]) == 0
    out = capsys.readouterr().out
    assert "# cpu threads: 1 (backend.cpu_threads auto: one per 1024 of the target's 64" in out
    monkeypatch.setenv("EAGLETREE_BACKEND__CPU_THREADS", "2")
    shown = show(capsys, str(settings))
    assert shown["backend"]["cpu_threads"] == 2
    assert main(["config", "show", str(settings)]) == 0
    assert "# cpu threads: 2 (backend.cpu_threads = 2)" in capsys.readouterr().out


def test_show_and_validate_take_the_settings_file_the_same_two_ways(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    paged = str(EXAMPLES / "paged-v1.toml")
    assert show(capsys, paged) == show(capsys, "--settings", paged)
    bad = tmp_path / "bad.toml"
    bad.write_text('[backend]\nkv_move = "cuda"\n')
    for argv in ([str(bad)], ["--settings", str(bad)]):
        assert main(["config", "validate", *argv]) == 1
        assert "backend.kv_move" in capsys.readouterr().err
    assert main(["config", "show", paged, "--settings", str(bad)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: config show got two settings files") and "give one" in err
