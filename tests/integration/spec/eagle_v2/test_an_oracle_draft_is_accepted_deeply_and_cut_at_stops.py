"""EagleWorkerV2 with an oracle draft: deep acceptance on side branches through
compaction with identical outputs, and stop ids, EOS and max_new_tokens cutting an
accepted path."""

from __future__ import annotations

import pytest
import torch

from eagletree.domain.compaction import accepted_move_plan
from eagletree.domain.request import FinishReason
from eagletree.domain.sampling import SamplingParams
from tests.integration.spec.eagle_v2.engines import CONFIGS, ModelCache, oracle_engine, prompts_for


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "S{}k{}N{}".format(*c))
def test_an_oracle_draft_is_accepted_deeply_on_side_branches_and_outputs_stay_identical(
    spec_models: ModelCache, config: tuple[int, int, int], device: torch.device
) -> None:
    num_steps, topk, n = config
    models = spec_models("llama", "eagle", device)
    prompts = prompts_for(6, seed=20)
    spec, oracle, expected = oracle_engine(models, config, prompts, 24)
    requests = [spec.engine.submit(p, SamplingParams(max_new_tokens=24)) for p in prompts]
    side_branch_accepts = moved_rows = 0
    while spec.engine.has_work():
        before = spec.worker.last_verification
        spec.engine.step()
        verification, tree = spec.worker.last_verification, spec.worker.last_tree
        if verification is None or verification is before:
            continue  # a prefill-only step
        assert tree is not None
        result = verification.result
        # SYNC: test inspection of the step's accepted paths
        bs = result.accept_length.shape[0]
        local = result.accept_index.long() - n * torch.arange(bs, device=device).unsqueeze(1)
        accepted = local[:, 1:].clamp(min=0)
        parents = torch.gather(tree.parents, 1, accepted).clamp(min=0)
        first_child = torch.gather(tree.retrieve_next_token, 1, parents)
        on_path = result.accept_index[:, 1:] >= 0
        side_branch_accepts += int(((first_child != accepted) & on_path).sum())
        tgt, _ = accepted_move_plan(
            result.accept_index, result.accept_length, verification.verify_slots, n
        )
        moved_rows += int((tgt != 0).sum())
    assert [r.output_ids for r in requests] == expected
    stats = spec.engine.stats.acceptance
    assert stats is not None
    print(
        f"oracle S={num_steps} k={topk} N={n}: mean acceptance length "
        f"{stats.mean_accept_length:.3f}, histogram {stats.histogram}"
    )
    if num_steps == 1:
        assert stats.mean_accept_length == 2.0  # the one draft is always right
    else:
        assert stats.mean_accept_length > 2.0
    if topk > 1:
        assert side_branch_accepts > 0 and moved_rows > 0
    else:
        assert side_branch_accepts == 0 and moved_rows == 0
    for request in requests:  # every verify step is recorded; only the last may overshoot
        overshoot = sum(request.emitted_per_step) - (len(request.output_ids) - 1)
        assert 0 <= overshoot < spec.worker.shape.tokens_per_step
    assert oracle.num_on_path_rows > 0


def test_stop_ids_eos_and_max_new_tokens_cut_an_accepted_path(
    spec_models: ModelCache, device: torch.device
) -> None:
    models = spec_models("llama", "eagle", device)
    # a chain oracle emits exactly S + 1 = 4 tokens per verify step: 1 | 2..5 | 6..9 | ...
    config = (3, 1, 4)
    prompts = prompts_for(3, seed=30)
    _, _, reference = oracle_engine(models, config, prompts, 12)
    cuts = [next(j for j in (2, 3, 6, 7) if ref[j] not in ref[:j]) for ref in reference]

    for stop in ("stop", "eos"):
        for prompt, ref, cut in zip(prompts, reference, cuts, strict=True):
            token = ref[cut]
            eos = (token,) if stop == "eos" else ()
            spec, _, _ = oracle_engine(models, config, [prompt], 12, eos_token_ids=eos)
            stop_ids = [token] if stop == "stop" else None
            [result] = spec.engine.generate([prompt], 12, stop_token_ids=stop_ids)
            assert result.output_ids == ref[: cut + 1]
            assert result.finish_reason is (
                FinishReason.STOP if stop == "stop" else FinishReason.EOS
            )
            assert result.acceptance is not None
            assert result.acceptance.num_emitted > len(result.output_ids) - 1  # cut mid-path

    spec, _, _ = oracle_engine(models, config, prompts, 12)
    results = spec.engine.generate(prompts, max_new_tokens=7)
    for result, ref in zip(results, reference, strict=True):
        assert result.output_ids == ref[:7]
        assert result.finish_reason is FinishReason.LENGTH
        assert result.acceptance is not None and result.acceptance.num_emitted == 8
    assert spec.memory.allocator.available_size() == spec.memory.allocator.size
