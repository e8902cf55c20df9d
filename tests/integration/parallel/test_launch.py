"""``eagletree generate --tp 2`` (or ``--dp 2``, or both) spawns its ranks itself (or runs as
torchrun's ranks) and prints, once, what one process prints (greedy, speculative, the tiny
random checkpoints on the CPU); unseeded sampling agrees on a seed across the ranks (else they
would diverge and fail)."""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from eagletree.adapters.models.random_checkpoint import write_random_checkpoint
from eagletree.app.cli import generate as generate_cli
from eagletree.app.parallel.process_group import free_port
from tests.integration.parallel.test_tensor_parallel import SIZES
from tests.integration.spec.harness import WEIGHT_STD

pytest.importorskip("pydantic_settings")
pytest.importorskip("dependency_injector")


def settings_env(target: Path, draft: Path) -> dict[str, str]:
    return {
        "EAGLETREE_MODEL__TARGET_PATH": str(target),
        "EAGLETREE_MODEL__DRAFT_PATH": str(draft),
        "EAGLETREE_MODEL__DEVICE": "cpu",
        "EAGLETREE_MODEL__DTYPE": "float32",
        "EAGLETREE_MODEL__MAX_CONTEXT_LEN": "64",
        "EAGLETREE_MEMORY__MAX_TOTAL_TOKENS": "1024",
        "EAGLETREE_SPECULATIVE__ALGORITHM": "eagle",
        "EAGLETREE_SPECULATIVE__NUM_STEPS": "3",
        "EAGLETREE_SPECULATIVE__EAGLE_TOPK": "2",
        "EAGLETREE_SPECULATIVE__NUM_DRAFT_TOKENS": "8",
    }


def generate(
    tp: int, target: Path, draft: Path, *options: str, torchrun: bool = False, dp: int = 1
) -> list[list[int]]:
    env = {**os.environ, **settings_env(target, draft)}
    command = [
        sys.executable,
        "-m",
        "eagletree.app.cli.main",
        "generate",
        "--tp",
        str(tp),
        "--json",
    ]
    command += ["--dp", str(dp)]
    if torchrun:  # torchrun starts the ranks; each joins its group
        launcher = ["-m", "torch.distributed.run", "--nproc-per-node", str(tp * dp)]
        command[1:1] = [*launcher, "--master-addr", "127.0.0.1", "--master-port", str(free_port())]
    command += ["--max-new-tokens", "10", "--no-progress"]
    command += ["--prompt-ids", "5 17 3", "--prompt-ids", "60 2 9 41 8", *options]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [json.loads(line)["output_ids"] for line in done.stdout.splitlines()]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    target, draft = write_random_checkpoint(
        tmp_path_factory.mktemp("launch"),
        "llama",
        "eagle",
        sizes=SIZES,
        dtype=torch.float32,
        std=WEIGHT_STD,
    )
    assert draft is not None
    return target, draft


@pytest.fixture(scope="module")
def single(checkpoints: tuple[Path, Path]) -> list[list[int]]:
    """What one process prints."""
    outputs = generate(1, *checkpoints)
    assert len(outputs) == 2 and all(len(ids) == 10 for ids in outputs)
    return outputs


# each launch starts 2 to 4 interpreters (8-14 s): the slow lane (README) runs them, .ci/run keeps
# the spawned --dp 2 launch and the refused flags
@pytest.mark.slow
def test_generate_with_tp_2_prints_the_single_process_tokens_once(
    checkpoints: tuple[Path, Path], single: list[list[int]]
) -> None:
    assert generate(2, *checkpoints) == single


@pytest.mark.slow
def test_generate_under_torchrun_prints_the_single_process_tokens_once(
    checkpoints: tuple[Path, Path], single: list[list[int]]
) -> None:
    assert generate(2, *checkpoints, torchrun=True) == single


@pytest.mark.slow
def test_unseeded_sampling_with_tp_2_completes(checkpoints: tuple[Path, Path]) -> None:
    # the exit status is checked by ``generate``; a sampled eos (id 2) may end a request early
    outputs = generate(2, *checkpoints, "--temperature", "1.0")
    assert len(outputs) == 2 and all(1 <= len(ids) <= 10 for ids in outputs)


def test_generate_with_dp_2_prints_the_single_process_tokens_once(
    checkpoints: tuple[Path, Path], single: list[list[int]]
) -> None:
    assert generate(1, *checkpoints, dp=2) == single


@pytest.mark.slow
def test_generate_with_tp_2_and_dp_2_under_torchrun_prints_the_single_process_tokens_once(
    checkpoints: tuple[Path, Path], single: list[list[int]]
) -> None:
    assert generate(2, *checkpoints, dp=2, torchrun=True) == single


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--dp", "0"], "--dp must be >= 1, got 0"),
        (["--dp", "2", "--stream"], "--stream is not supported with --dp"),
    ],
)
def test_bad_parallel_flags_exit_1_before_any_rank_starts(
    checkpoints: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
    flags: list[str],
    message: str,
) -> None:
    for name, value in settings_env(*checkpoints).items():
        monkeypatch.setenv(name, value)
    parser = argparse.ArgumentParser(prog="eagletree")
    generate_cli.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["generate", "--prompt-ids", "5 17 3", *flags])
    out, err = io.StringIO(), io.StringIO()
    assert generate_cli.run(args, out=out, err=err) == 1
    assert message in err.getvalue()
    assert out.getvalue() == ""
