"""``eagletree generate --tp 2`` spawns two ranks itself (or runs as torchrun's two ranks) and
prints, once, what one process prints (greedy, speculative, the tiny random checkpoints on the
CPU); unseeded sampling agrees on a seed across the ranks (else they would diverge and fail)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from eagletree.adapters.models.random_checkpoint import write_random_checkpoint
from eagletree.app.distributed import free_port
from tests.integration.parallel.test_tensor_parallel import SIZES
from tests.integration.spec.harness import WEIGHT_STD

pytest.importorskip("pydantic_settings")
pytest.importorskip("dependency_injector")


def generate(
    tp: int, target: Path, draft: Path, *options: str, torchrun: bool = False
) -> list[list[int]]:
    env = {
        **os.environ,
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
    command = [sys.executable, "-m", "eagletree.app.cli", "generate", "--tp", str(tp), "--json"]
    if torchrun:  # torchrun starts the ranks; each joins its group
        launcher = ["-m", "torch.distributed.run", "--nproc-per-node", str(tp)]
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


def test_generate_with_tp_2_prints_the_single_process_tokens_once(
    checkpoints: tuple[Path, Path],
) -> None:
    single = generate(1, *checkpoints)
    assert len(single) == 2 and all(len(ids) == 10 for ids in single)
    assert generate(2, *checkpoints) == single


def test_generate_under_torchrun_prints_the_single_process_tokens_once(
    checkpoints: tuple[Path, Path],
) -> None:
    assert generate(2, *checkpoints, torchrun=True) == generate(1, *checkpoints)


def test_unseeded_sampling_with_tp_2_completes(checkpoints: tuple[Path, Path]) -> None:
    # the exit status is checked by ``generate``; a sampled eos (id 2) may end a request early
    outputs = generate(2, *checkpoints, "--temperature", "1.0")
    assert len(outputs) == 2 and all(1 <= len(ids) <= 10 for ids in outputs)
