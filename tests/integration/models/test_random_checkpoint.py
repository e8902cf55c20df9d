"""`eagletree init-random`: reproducible random checkpoints that we and transformers both load."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from eagletree.adapters.models.draft_loading import DraftKind
from eagletree.adapters.models.loading import load_models, load_target
from eagletree.adapters.models.random_checkpoint import checkpoint_layout, write_random_checkpoint
from eagletree.adapters.models.random_checkpoint_config import PRESETS, Arch, ModelSizes
from eagletree.adapters.models.runner import TargetModelRunner
from eagletree.app.cli import init_random as init_random_cli
from tests.integration.models.harness import Memory, Requests, random_prompts, relative_error

TINY = [
    "--vocab-size", "64", "--hidden-size", "32", "--intermediate-size", "48", "--num-layers", "4",
    "--num-heads", "4", "--num-kv-heads", "2", "--head-dim", "8", "--kv-lora-rank", "16",
    "--qk-nope-head-dim", "8", "--qk-rope-head-dim", "4", "--v-head-dim", "8",
    "--draft-vocab-size", "24", "--num-mtp-layers", "2",
]  # fmt: skip


def cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="eagletree")
    init_random_cli.add_parser(parser.add_subparsers(dest="command", required=True))
    return init_random_cli.run(parser.parse_args(["init-random", *argv]))


@pytest.mark.parametrize(
    ("arch", "draft", "extra"),
    [("llama", "eagle3", []), ("deepseek-mla", "mtp", ["--q-lora-rank", "0"])],
)
def test_init_random_writes_a_target_and_draft_that_load(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    arch: Arch,
    draft: DraftKind,
    extra: list[str],
) -> None:
    argv = ["--arch", arch, "--draft", draft, "--out", str(tmp_path), "--dtype", "float32"]
    assert cli([*argv, *TINY, *extra]) == 0
    assert "draft (" in capsys.readouterr().out
    models = load_models(tmp_path / "target", tmp_path / "draft", draft, torch.float32, "cpu")
    assert models.target.vocab_size == 64
    assert len(models.drafts) == (2 if draft == "mtp" else 1)
    if arch == "deepseek-mla":
        assert models.target.config.q_lora_rank is None  # type: ignore[union-attr]


def test_init_random_refuses_to_overwrite_and_to_mix_presets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--arch", "llama", "--out", str(tmp_path), *TINY]
    assert cli(argv) == 0
    assert cli(argv) == 1
    assert "exists (pass --force" in capsys.readouterr().err
    assert cli([*argv, "--force"]) == 0
    assert cli(["--arch", "deepseek-mla", "--preset", "llama3-8b", "--out", str(tmp_path)]) == 1
    assert "use --arch llama" in capsys.readouterr().err


def test_the_same_seed_writes_the_same_weights_and_another_seed_does_not(tmp_path: Path) -> None:
    sizes = ModelSizes(vocab_size=64, hidden_size=32, num_layers=2, head_dim=8)
    written = {}
    for name, seed in (("a", 5), ("b", 5), ("c", 6)):
        target_dir, _ = write_random_checkpoint(tmp_path / name, "llama", None, seed, sizes)
        written[name] = load_file(str(target_dir / "model.safetensors"))
    weight = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(written["a"][weight], written["b"][weight])
    assert not torch.equal(written["a"][weight], written["c"][weight])


def test_the_llama3_8b_preset_has_llama_3_1_8b_and_eagle3_draft_dimensions() -> None:
    target, draft = checkpoint_layout("llama", "eagle3", PRESETS["llama3-8b"])  # meta: no memory
    assert sum(t.numel() for t in target.values()) == 8_030_261_248
    assert tuple(draft["fc.weight"].shape) == (4096, 3 * 4096)
    assert tuple(draft["midlayer.self_attn.q_proj.weight"].shape) == (4096, 2 * 4096)
    assert tuple(draft["lm_head.weight"].shape) == (32000, 4096)


@pytest.mark.hf
@pytest.mark.parametrize("arch", ["llama", "deepseek-mla"])
def test_transformers_loads_our_random_target_and_computes_our_logits(
    tmp_path: Path, arch: Arch
) -> None:
    transformers = pytest.importorskip("transformers")
    sizes = ModelSizes(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=3, head_dim=8,
        kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, llama3_rope=True,
    )  # fmt: skip
    target_dir, _ = write_random_checkpoint(
        tmp_path,
        arch,
        None,
        seed=7,
        sizes=sizes,
        dtype=torch.float32,
        std=0.3,
    )
    reference = transformers.AutoModelForCausalLM.from_pretrained(target_dir).eval()
    model = load_target(target_dir, torch.float32, "cpu")
    memory = Memory(torch.device("cpu"))
    runner = TargetModelRunner(model, *memory.runner_parts(model.kv_layout, "torch", torch.float32))
    (prompt,) = random_prompts(64, [7], seed=8)
    ours = runner.forward(Requests(memory, 1).extend([prompt]))
    with torch.no_grad():
        theirs = reference(torch.tensor([prompt])).logits[0]
    assert relative_error(ours.logits, theirs) <= 1e-4
