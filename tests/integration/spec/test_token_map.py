"""An EAGLE head restricted by ``speculative.token_map``, built through the container: it drafts
from the mapped tokens' lm_head rows, stays lossless, and a map of every token in shuffled
order drafts exactly what the unrestricted head drafts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from eagletree.adapters.models.eagle import EagleDraft
from eagletree.adapters.models.random_checkpoint import write_random_checkpoint
from eagletree.domain.errors import ConfigurationError
from tests.integration.spec.harness import SIZES, WEIGHT_STD, ragged_prompts

pytest.importorskip("pydantic_settings")
pytest.importorskip("dependency_injector")

from eagletree.app.composition.container import build_engine, build_engine_container
from eagletree.app.engine.loop import Engine
from eagletree.config.settings import EngineSettings

TREE = {"algorithm": "eagle", "num_steps": 3, "eagle_topk": 4, "num_draft_tokens": 8}
PROMPTS = ragged_prompts(SIZES.vocab_size, [3, 7, 1, 5], seed=31)
NEW_TOKENS = 16


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    target, draft = write_random_checkpoint(
        tmp_path_factory.mktemp("token-map"), "llama", "eagle", sizes=SIZES, std=WEIGHT_STD
    )
    assert draft is not None
    return str(target), str(draft)


def settings(checkpoints: tuple[str, str], **speculative: Any) -> EngineSettings:
    target, draft = checkpoints
    return EngineSettings(
        model={"target_path": target, "draft_path": draft, "dtype": "float32", "device": "cpu"},
        speculative={**TREE, **speculative} if speculative.get("algorithm") != "none" else {},
        backend={"attention": "torch", "kv_move": "torch"},
        memory={"max_total_tokens": 1024, "max_running_requests": 4},
    )


def generate(engine: Engine) -> list[tuple[list[int], tuple[int, ...] | None]]:
    results = engine.generate(PROMPTS, max_new_tokens=NEW_TOKENS)
    return [
        (r.output_ids, None if r.acceptance is None else r.acceptance.histogram) for r in results
    ]


def test_a_shuffled_map_of_every_token_drafts_what_the_whole_vocabulary_does(
    checkpoints: tuple[str, str], tmp_path: Path
) -> None:
    shuffled = torch.randperm(SIZES.vocab_size, generator=torch.Generator().manual_seed(3))
    path = tmp_path / "every-token.json"
    path.write_text(json.dumps(shuffled.tolist()))
    whole = generate(build_engine(settings(checkpoints)))
    mapped = generate(build_engine(settings(checkpoints, token_map=str(path))))
    assert mapped == whole  # the same tokens and the same accepted length at every step
    assert any(sum(histogram[2:]) for _, histogram in whole if histogram)  # drafts accepted


def test_a_map_of_some_tokens_holds_their_lm_head_rows_and_stays_lossless(
    checkpoints: tuple[str, str], tmp_path: Path
) -> None:
    ids = torch.randperm(SIZES.vocab_size, generator=torch.Generator().manual_seed(4))[:40]
    path = tmp_path / "hot.pt"
    torch.save(ids, path)
    container = build_engine_container(settings(checkpoints, token_map=str(path)))
    (head,) = container.draft_models()
    assert isinstance(head, EagleDraft) and head.mapped_lm_head is not None
    assert head.token_ids is not None and torch.equal(head.token_ids, ids)
    lm_head = container.target_model().lm_head.weight
    assert torch.equal(head.mapped_lm_head.weight, lm_head[ids])
    hidden = torch.randn(5, SIZES.hidden_size)
    torch.testing.assert_close(head.compute_logits(hidden), hidden @ lm_head[ids].t())
    plain = build_engine(settings(checkpoints, algorithm="none"))
    expected = [r.output_ids for r in plain.generate(PROMPTS, max_new_tokens=NEW_TOKENS)]
    assert [outputs for outputs, _ in generate(container.engine())] == expected


@pytest.mark.parametrize(
    ("content", "speculative", "message"),
    [
        (None, {}, r"speculative\.token_map: token map .* does not exist"),
        ([3, 5, 3], {}, r"speculative\.token_map: .*1 ids repeat"),
        ([3, 96], {}, r"speculative\.token_map: .*ids 3\.\.96 leave the target vocabulary 0\.\.95"),
        ([1.5, 2.0], {}, r"token ids must be integers"),
        ([1, 2, 3], {}, r"speculative\.eagle_topk = 4 exceeds the 3 tokens .*token_map"),
        ([1, 2, 3, 4], {"algorithm": "eagle3"}, r"speculative\.token_map = .* unset"),
    ],
)
def test_a_bad_token_map_is_refused_naming_the_setting(
    checkpoints: tuple[str, str],
    tmp_path: Path,
    content: list[float] | None,
    speculative: dict[str, Any],
    message: str,
) -> None:
    path = tmp_path / "map.json"
    if content is not None:
        path.write_text(json.dumps(content))
    with pytest.raises(ConfigurationError, match=message):
        build_engine(settings(checkpoints, token_map=str(path), **speculative))
