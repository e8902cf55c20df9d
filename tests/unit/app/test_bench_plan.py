"""`eagletree bench` settings: defaults by device, a settings file, flags over both, sizing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from eagletree.app.bench.arrivals import background_budget
from eagletree.app.bench.configs import parse_config, parse_configs
from eagletree.app.bench.measure import token_budget
from eagletree.app.bench.options import parser
from eagletree.app.bench.plan import plan_run, settings_for
from eagletree.domain.errors import ConfigurationError


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    """A directory that looks like a checkpoint (planning does not load weights)."""
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text("{}")
    return target


def test_without_a_settings_file_the_cpu_defaults_are_float32_and_torch(
    checkpoint: Path,
) -> None:
    args = parser().parse_args(
        ["--target", str(checkpoint), "--device", "cpu", "--configs", "plain", "tree:S3,k2,N6"]
    )
    configs = parse_configs(args.configs)
    p = plan_run(args, configs, notify=print)
    base = p.base
    assert (base.model.device, base.model.dtype) == ("cpu", "float32")
    assert (base.backend.attention, base.backend.kv_move) == ("torch", "torch")
    assert base.model.target_path == str(checkpoint) and base.model.draft_path is None
    assert not p.cuda and p.draft_kind == "eagle"
    # sized for bs 32 and the tree's longest step: nothing is retracted or cut short
    assert base.memory.max_running_requests == 32
    budget = token_budget(48, 2, 3, max_tokens_per_step=4)
    assert base.model.max_context_len is not None
    assert base.model.max_context_len >= 256 + budget + 1
    assert base.memory.max_total_tokens >= 32 * base.model.max_context_len
    tree = settings_for(p, configs[1]).speculative
    assert (tree.algorithm, tree.num_steps, tree.eagle_topk, tree.num_draft_tokens) == (
        "eagle",
        3,
        2,
        6,
    )
    assert settings_for(p, configs[0]).speculative.algorithm == "none"


def test_a_settings_file_gives_the_defaults_and_flags_override_it(
    checkpoint: Path, tmp_path: Path
) -> None:
    file = tmp_path / "bench.toml"
    file.write_text(
        f'[model]\ntarget_path = "{checkpoint}"\ndevice = "cpu"\ndtype = "bfloat16"\n'
        '[backend]\nattention = "triton"\nkv_move = "torch"\ncuda_graph = "off"\n'
        '[speculative]\nalgorithm = "eagle3"\nsampled_drafts = "top_k"\n'
        "[memory]\nmax_total_tokens = 1000000\n"
    )
    args = parser().parse_args(["--settings", str(file), "--attention", "torch"])
    p = plan_run(args, parse_configs(["chain:S2"]), notify=print)
    assert p.base.model.dtype == "bfloat16" and p.base.backend.kv_move == "torch"
    assert p.base.backend.attention == "torch"  # the flag wins
    assert p.base.backend.cuda_graph == "off"
    assert p.base.memory.max_total_tokens == 1_000_000  # the file's larger pool is kept
    assert p.draft_kind == "eagle3"  # the file's algorithm names the draft head
    chain = settings_for(p, parse_config("chain:S2")).speculative
    assert (chain.algorithm, chain.num_draft_tokens) == ("eagle3", 3)
    assert chain.sampled_drafts == "top_k"  # an A/B of drawn drafts runs from a settings file
    args = parser().parse_args(["--settings", str(file), "--cuda-graph", "on", "--draft", "eagle"])
    p = plan_run(args, parse_configs(["plain"]), notify=print)
    assert p.base.backend.cuda_graph == "on" and p.draft_kind == "eagle"
    assert p.base.scheduler.overlap == "auto"
    args = parser().parse_args(["--settings", str(file), "--overlap", "off"])
    assert plan_run(args, parse_configs(["plain"]), notify=print).base.scheduler.overlap == "off"


def test_a_settings_file_that_names_no_device_runs_on_the_machine_at_hand(
    checkpoint: Path, tmp_path: Path
) -> None:
    # an A/B of one setting: the file says nothing of the model, whose device is then "auto"
    file = tmp_path / "ab.toml"
    file.write_text('[speculative]\nsampled_drafts = "top_k"\n')
    args = parser().parse_args(["--target", str(checkpoint), "--settings", str(file)])
    p = plan_run(args, parse_configs(["chain:S2"]), notify=print)
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert p.base.model.device == expected and p.cuda == (expected == "cuda")
    assert settings_for(p, parse_config("chain:S2")).speculative.sampled_drafts == "top_k"


def test_contexts_are_cut_to_the_targets_positions_and_a_window_that_cannot_fit_is_refused(
    checkpoint: Path,
) -> None:
    (checkpoint / "config.json").write_text('{"max_position_embeddings": 640}')
    flags = ["--target", str(checkpoint), "--device", "cpu", "--prompt-len", "64"]
    said: list[str] = []
    args = parser().parse_args([*flags, "--new-tokens", "256", "--configs", "chain:S7"])
    p = plan_run(args, parse_configs(args.configs), notify=said.append)
    # every step accepting all 8 tokens would need about 2,000 positions; the target has 640
    assert p.base.model.max_context_len == 640
    assert len(said) == 1 and "640 positions" in said[0]
    args = parser().parse_args([*flags, "--new-tokens", "600", "--configs", "chain:S7"])
    with pytest.raises(ConfigurationError, match="--new-tokens"):
        plan_run(args, parse_configs(args.configs), notify=said.append)


def test_the_arrivals_mode_sizes_for_the_background_batch_and_every_arrival(
    checkpoint: Path,
) -> None:
    argv = ["--target", str(checkpoint), "--device", "cpu", "--batch-sizes", "4", "16"]
    arrivals = [*argv, "--arrivals", "5", "--num-arrivals", "6", "--prefill-step", "alone"]
    plain = plan_run(parser().parse_args(argv), parse_configs(["chain:S3"]), notify=print).base
    args = parser().parse_args(arrivals)
    base = plan_run(args, parse_configs(["chain:S3"]), notify=print).base
    assert plain.scheduler.prefill_step == "with_decode"
    assert base.scheduler.prefill_step == "alone"
    assert base.memory.max_running_requests == 16 + 6
    budget = background_budget(48, 5, 6, warmup_steps=2, max_tokens_per_step=4)
    assert base.model.max_context_len is not None
    assert base.model.max_context_len >= 256 + budget + 1
    assert base.memory.max_total_tokens >= (16 + 6) * base.model.max_context_len
