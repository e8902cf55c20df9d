"""The eagle-family rules that reject settings: one row per contradiction, with the
exact error text naming what to change."""

from __future__ import annotations

from tests.unit.config.eagle_hook.table import (
    DEEPSEEK_V3,
    MTP3,
    PAGED_REASON,
    QWEN3_NEXT,
    RECURRENT_REASON,
    TARGET_ONLY,
    Case,
    spec,
)

REJECTING = [
    Case(
        "eagle without a draft checkpoint",
        spec(3, 4, 8, algorithm="eagle"),
        model=dict(TARGET_ONLY),
        error="speculative.algorithm = 'eagle' needs a draft checkpoint: set model.draft_path, "
        "or use speculative.algorithm = 'mtp' with a target that has MTP layers, or 'none'",
    ),
    Case(
        "eagle3 without a draft checkpoint",
        spec(3, 4, 8, algorithm="eagle3"),
        model={},
        error="speculative.algorithm = 'eagle3' needs a draft checkpoint",
    ),
    Case(
        "mtp on a target without MTP layers",
        spec(3, 1, 4, algorithm="mtp"),
        error="speculative.algorithm = 'mtp' drafts with the target checkpoint's MTP layers and "
        "LlamaForCausalLM has none: set speculative.algorithm = 'eagle' or 'eagle3' with "
        "model.draft_path, or 'none'",
    ),
    Case(
        "mtp without any checkpoint path",
        spec(3, 1, 4, algorithm="mtp"),
        model={},
        target=DEEPSEEK_V3,
        error="speculative.algorithm = 'mtp' reads its draft layers from the target checkpoint: "
        "set model.target_path",
    ),
    Case(
        "only the number of steps is set",
        {"algorithm": "eagle", "num_steps": 3},
        error="speculative.num_steps, speculative.eagle_topk and speculative.num_draft_tokens "
        "are set together or not at all; speculative.num_steps set but speculative.eagle_topk, "
        "speculative.num_draft_tokens missing: set speculative.eagle_topk and "
        "speculative.num_draft_tokens, or unset speculative.num_steps to let the target "
        "architecture choose",
    ),
    Case(
        "only the number of steps is missing",
        {"algorithm": "eagle", "eagle_topk": 2, "num_draft_tokens": 6},
        error="speculative.eagle_topk, speculative.num_draft_tokens set but speculative.num_steps "
        "missing: set speculative.num_steps, or unset speculative.eagle_topk and "
        "speculative.num_draft_tokens",
    ),
    Case(
        "a tree larger than the draft can fill",
        spec(3, 2, 12, algorithm="eagle"),
        error="speculative.num_draft_tokens = 12 is larger than the tree: num_steps = 3 with "
        "eagle_topk = 2 drafts at most 2 + (3 - 1)·2² = 10 tokens besides the root; set "
        "speculative.num_draft_tokens <= 11 or raise speculative.num_steps or "
        "speculative.eagle_topk",
    ),
    Case(
        "a one-step tree larger than its beam",
        spec(1, 4, 6, algorithm="eagle"),
        error="speculative.num_draft_tokens = 6 is larger than the tree: num_steps = 1 with "
        "eagle_topk = 4 drafts at most 4 + (1 - 1)·4² = 4 tokens besides the root",
    ),
    Case(
        "multi-layer MTP with a tree",
        spec(3, 2, 6, algorithm="mtp"),
        model=dict(TARGET_ONLY),
        target=MTP3,
        error="multi-layer MTP (MiMoForCausalLM has 3 MTP layers) drafts a chain: set "
        "speculative.eagle_topk = 1 (now 2) and speculative.num_draft_tokens = num_steps + 1",
    ),
    Case(
        "multi-layer MTP with more steps than layers",
        spec(4, 1, 5, algorithm="mtp"),
        model=dict(TARGET_ONLY),
        target=MTP3,
        error="multi-layer MTP runs one MTP layer per draft step and MiMoForCausalLM has 3 MTP "
        "layers: set speculative.num_steps <= 3 (now 4)",
    ),
    Case(
        "multi-layer MTP on v1",
        spec(3, 1, 4, algorithm="mtp", version="v1"),
        model=dict(TARGET_ONLY),
        target=MTP3,
        error="multi-layer MTP (MiMoForCausalLM has 3 MTP layers) has only a v2 worker: set "
        "speculative.version = 'auto' or 'v2'",
    ),
    Case(
        "an explicit v2 on a paged tree",
        spec(3, 4, 8, algorithm="eagle", version="v2"),
        memory={"page_size": 4},
        error=f"speculative.version = 'v2' cannot run this configuration ({PAGED_REASON}): set "
        "memory.page_size = 1 or speculative.eagle_topk = 1, or speculative.version = 'auto' "
        "to run v1",
    ),
    Case(
        "an explicit v2 tree on a recurrent target",
        spec(3, 4, 8, algorithm="eagle", version="v2"),
        target=QWEN3_NEXT,
        error=f"speculative.version = 'v2' cannot run this configuration ({RECURRENT_REASON}): "
        "set speculative.eagle_topk = 1, or speculative.version = 'auto' to run v1",
    ),
]
