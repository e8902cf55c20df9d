"""FP8 draft heads end to end (``speculative.draft_quantization = 'fp8'``) through the container.

A quantized head proposes other tokens than its original, never other outputs: the target
verifies in its own dtype, so greedy speculation still emits the plain greedy tokens. The
head's own linear layers hold FP8 weights, and the target modules it borrows (EAGLE-1's
lm_head and embedding) stay exact. On CUDA the head's layers run the FP8 weight-stream kernel
inside the captured step graphs; on the CPU the widened-weight reference.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch

from eagletree.adapters.models.loading import DraftKind
from eagletree.adapters.models.random_checkpoint import write_random_checkpoint
from eagletree.adapters.models.streamed_linear import FP8_DTYPE, StreamedLinear
from eagletree.app.engine import Engine
from tests.integration.spec.harness import SIZES, WEIGHT_STD, greedy_outputs, ragged_prompts

pytest.importorskip("pydantic_settings")
pytest.importorskip("dependency_injector")

from eagletree.app.container import build_engine_container
from eagletree.config.settings import EngineSettings
from eagletree.domain.errors import ConfigurationError

SPECULATIVE = {"num_steps": 3, "eagle_topk": 2, "num_draft_tokens": 6}


def _settings(
    root: Path, kind: DraftKind, quantization: str | None, device: torch.device
) -> EngineSettings:
    target_dir, draft_dir = write_random_checkpoint(
        root,
        "llama",
        kind,
        sizes=SIZES,
        dtype=torch.float32,
        std=WEIGHT_STD,
    )
    options: dict[str, Any] = {
        "model": {"target_path": str(target_dir), "dtype": "float32", "device": str(device),
                  "max_context_len": 64},
        "memory": {"max_total_tokens": 1024, "max_running_requests": 4},
    }  # fmt: skip
    if quantization is not None:
        options["model"]["draft_path"] = str(draft_dir)
        options["speculative"] = {
            "algorithm": kind, "draft_quantization": quantization, **SPECULATIVE
        }  # fmt: skip
    return EngineSettings(**options)


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_an_fp8_head_keeps_greedy_speculation_lossless_and_the_target_exact(
    kind: DraftKind, tmp_path: Path, device: torch.device
) -> None:
    prompts = ragged_prompts(SIZES.vocab_size, [3, 7, 1], seed=90)
    plain = Engine.from_settings(_settings(tmp_path / "plain", kind, None, device))
    expected = greedy_outputs(plain, prompts, 10)
    container = build_engine_container(_settings(tmp_path / "fp8", kind, "fp8", device))
    (head,) = container.draft_models()
    target = container.target_model()
    target_linears = {id(m) for m in target.modules() if isinstance(m, StreamedLinear)}
    own = [
        m for m in head.modules() if isinstance(m, StreamedLinear) and id(m) not in target_linears
    ]
    assert own and all(m.weight.dtype == FP8_DTYPE for m in own)
    assert all(p.dtype == torch.float32 for p in target.parameters())
    results = container.engine().generate(prompts, max_new_tokens=10)
    assert [r.output_ids for r in results] == expected


def test_mtp_layers_refuse_fp8_and_without_a_draft_the_setting_is_reported_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from eagletree.config.eagle_hook import resolve_speculative
    from eagletree.config.target import TargetDescription

    settings = EngineSettings(speculative={"algorithm": "mtp", "draft_quantization": "fp8"},
                              model={"target_path": str(tmp_path)})  # fmt: skip
    mla = TargetDescription(architecture="DeepseekV3ForCausalLM", num_mtp_layers=1)
    refusal = re.escape("speculative.draft_quantization = 'fp8'")
    with pytest.raises(ConfigurationError, match=refusal):
        resolve_speculative(settings, mla)
    quiet = EngineSettings(speculative={"draft_quantization": "fp8"})
    resolved = resolve_speculative(quiet, mla)
    assert resolved.draft_quantization == "none"
    assert any("speculative.draft_quantization" in w for w in resolved.warnings)
