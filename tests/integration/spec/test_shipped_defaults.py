"""End to end through ``Engine.from_settings`` with the shipped backend defaults.

The settings leave ``backend`` unset on CUDA, so the container builds what users get: Triton
attention and the Triton KV mover (named explicitly on the CPU, whose default is torch, and
run under ``TRITON_INTERPRET=1``; tiny shapes keep it fast). For the
v2 worker, the v1 worker (page_size 4 with a tree, the paged fallback) and the multi-layer MTP
worker: greedy speculation emits the plain greedy tokens with the random draft heads, and with
oracle heads (``oracle_head.py``) that put every true token on a side branch of the tree, so
deep acceptance needs the Triton mover's compaction to be exact.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from eagletree.adapters.models.draft_loading import DraftKind
from eagletree.adapters.models.random_checkpoint import write_random_checkpoint
from eagletree.adapters.models.random_checkpoint_config import Arch, ModelSizes
from eagletree.app.composition.container import build_engine_container
from eagletree.app.composition.platform import resolve_platform
from eagletree.app.engine.loop import Engine
from eagletree.domain.sampling import SamplingParams
from tests.conftest import requires_triton
from tests.integration.spec.harness import WEIGHT_STD, greedy_outputs, ragged_prompts
from tests.integration.spec.oracle_head import install_oracle_heads

pytest.importorskip("pydantic_settings")
pytest.importorskip("dependency_injector")

from eagletree.app.composition.container import build_engine
from eagletree.config.settings import EngineSettings

# one target layer: the interpreted Triton attention runs per layer, and one shows what these
# tests check (the backends' defaults, compaction through deep acceptance) as well as two
SIZES = ModelSizes(
    vocab_size=96,
    hidden_size=64,
    intermediate_size=96,
    num_layers=1,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    max_position_embeddings=128,
    draft_vocab_size=64,
)
PROMPT_LENGTHS = [3, 7, 1]
MAX_NEW = 12
MEMORY = {"max_total_tokens": 1024, "max_running_requests": 4}


@dataclass(frozen=True)
class WorkerCase:
    arch: Arch
    kind: DraftKind
    num_mtp_layers: int
    speculative: dict[str, Any]
    page_size: int = 1

    @property
    def topk(self) -> int:
        return int(self.speculative["eagle_topk"])

    @property
    def num_steps(self) -> int:
        return int(self.speculative["num_steps"])


CASES = {
    "v2-tree": WorkerCase(
        "llama", "eagle", 1, {"num_steps": 3, "eagle_topk": 2, "num_draft_tokens": 8}
    ),
    # topk > 1 with page_size 4 resolves to the v1 worker
    "v1-paged-tree": WorkerCase(
        "llama", "eagle", 1, {"num_steps": 3, "eagle_topk": 2, "num_draft_tokens": 8}, page_size=4
    ),
    "mtp-2-layers": WorkerCase(
        "deepseek-mla", "mtp", 2, {"num_steps": 2, "eagle_topk": 1, "num_draft_tokens": 3}
    ),
}


Checkpoints = Callable[[WorkerCase], tuple[str, str]]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Checkpoints:
    """Random float32 target and draft checkpoints, written once per (arch, kind, MTP layers)."""
    cache: dict[tuple[str, str, int], tuple[str, str]] = {}

    def get(case: WorkerCase) -> tuple[str, str]:
        key = (case.arch, case.kind, case.num_mtp_layers)
        if key not in cache:
            sizes = dataclasses.replace(SIZES, num_mtp_layers=case.num_mtp_layers)
            target_dir, draft_dir = write_random_checkpoint(
                tmp_path_factory.mktemp("-".join(map(str, key))),
                case.arch,
                case.kind,
                sizes=sizes,
                dtype=torch.float32,
                std=WEIGHT_STD,
            )
            assert draft_dir is not None
            if case.kind == "mtp":  # the target declares its NextN layers; they are in draft_dir
                config = json.loads((target_dir / "config.json").read_text())
                config["num_nextn_predict_layers"] = case.num_mtp_layers
                (target_dir / "config.json").write_text(json.dumps(config))
            cache[key] = (str(target_dir), str(draft_dir))
        return cache[key]

    return get


def engine_settings(
    case: WorkerCase,
    device: torch.device,
    dirs: tuple[str, str],
    *,
    speculative: bool,
    cuda_graph: str | None = None,
) -> EngineSettings:
    """``case``'s settings with every backend left at its CUDA default (``cuda_graph`` aside):
    on the CPU, whose default is torch, the Triton backends are named (the interpreter runs
    them)."""
    target_path, draft_path = dirs
    model = {"target_path": target_path, "dtype": "float32", "device": str(device)}
    backend: dict[str, str] = {}
    if device.type == "cpu":
        backend = {"attention": "triton", "kv_move": "triton"}
    if cuda_graph is not None:
        backend["cuda_graph"] = cuda_graph
    options: dict[str, Any] = {
        "model": {**model, "max_context_len": 64},
        "memory": {**MEMORY, "page_size": case.page_size},
        "backend": backend,
    }
    if speculative:
        options["model"]["draft_path"] = draft_path
        options["speculative"] = {"algorithm": case.kind, **case.speculative}
    settings = EngineSettings(**options)
    backends = resolve_platform(settings).backend
    assert (backends.attention, backends.kv_move) == ("triton", "triton")
    return settings


def prompts_for(seed: int) -> list[list[int]]:
    return ragged_prompts(SIZES.vocab_size, PROMPT_LENGTHS, seed)


@pytest.mark.parametrize("name", list(CASES))
def test_greedy_speculation_with_the_default_backends_emits_the_plain_greedy_tokens(
    name: str, checkpoints: Checkpoints, device: torch.device
) -> None:
    requires_triton(device)
    case = CASES[name]
    dirs = checkpoints(case)
    prompts = prompts_for(seed=70)
    plain = build_engine(engine_settings(case, device, dirs, speculative=False))
    expected = greedy_outputs(plain, prompts, MAX_NEW)
    engine = build_engine(engine_settings(case, device, dirs, speculative=True))
    results = engine.generate(prompts, max_new_tokens=MAX_NEW)
    assert [r.output_ids for r in results] == expected
    assert all(r.acceptance is not None for r in results)


@pytest.mark.parametrize("name", list(CASES))
def test_an_oracle_draft_behind_the_default_backends_is_accepted_deeply_and_stays_lossless(
    name: str,
    checkpoints: Checkpoints,
    device: torch.device,
) -> None:
    requires_triton(device)
    case = CASES[name]
    dirs = checkpoints(case)
    prompts = prompts_for(seed=71)
    margin = case.num_steps + 2  # the oracle looks up to S + 1 tokens past the committed ones
    plain = build_engine(engine_settings(case, device, dirs, speculative=False))
    continuation = greedy_outputs(plain, prompts, MAX_NEW + margin)
    sequences = {tuple(p): [*p, *out] for p, out in zip(prompts, continuation, strict=True)}
    engines: list[Engine] = []

    def sequence_of_row(row: int) -> list[int]:
        [owner] = [r for r in engines[0].scheduler.running if r.row == row]
        return sequences[owner.prompt_ids]

    # the oracle reads tensors on the host, which a captured CUDA graph cannot replay
    settings = engine_settings(case, device, dirs, speculative=True, cuda_graph="off")
    container = build_engine_container(settings)
    heads = install_oracle_heads(container, sequence_of_row, case.topk)
    engines.append(container.engine())
    assert len(heads) == (case.num_mtp_layers if case.kind == "mtp" else 1)
    requests = [engines[0].submit(p, SamplingParams(max_new_tokens=MAX_NEW)) for p in prompts]
    while engines[0].has_work():
        engines[0].step()
    assert [r.output_ids for r in requests] == [out[:MAX_NEW] for out in continuation]
    stats = engines[0].stats.acceptance
    assert stats is not None and sum(h.num_on_path_rows for h in heads) > 0
    print(f"{name} on {device}: mean acceptance {stats.mean_accept_length:.3f} {stats.histogram}")
    # With topk > 1 the true token is never a node's first child: a verifier that followed first
    # children only, or a compaction that lost a moved row, could not get past one token a step.
    assert stats.mean_accept_length > 2.0
    assert stats.histogram[case.num_steps + 1] > 0  # some steps accept every draft
    assert sum(stats.histogram[: case.num_steps + 1]) > 0  # and some reject one
