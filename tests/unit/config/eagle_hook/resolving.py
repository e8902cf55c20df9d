"""The eagle-family rules that resolve settings: one row per rule, with the resolved
values and the exact warning texts."""

from __future__ import annotations

from eagletree.config.eagle_hook import (
    DEEPSEEK_FAMILY_PARAMETERS,
    LLAMA_FAMILY_PARAMETERS,
    OTHER_PARAMETERS,
)
from tests.unit.config.eagle_hook.table import (
    DEEPSEEK_V3,
    DEEPSEEK_V32,
    MTP3,
    PAGED_REASON,
    QWEN2,
    QWEN3_NEXT,
    RECURRENT_REASON,
    TARGET_ONLY,
    UNKNOWN_MLA,
    Case,
    parameters,
    spec,
)

RESOLVING = [
    Case(
        "algorithm none disables speculation",
        {},
        model={},
        expect=dict(
            algorithm="none",
            version=None,
            num_steps=0,
            topk=1,
            num_draft_tokens=1,
            draft_path=None,
            worker="none",
        ),
    ),
    Case(
        "algorithm none keeps an explicit request limit",
        {"algorithm": "none"},
        memory={"max_running_requests": 8},
        expect=dict(max_running_requests=8, worker="none"),
    ),
    Case(
        "algorithm none without a request limit uses 48 silently",
        {"algorithm": "none"},
        memory={},
        expect=dict(max_running_requests=48),
    ),
    Case(
        "algorithm none warns about the speculative settings it ignores",
        {"algorithm": "none", "num_steps": 3, "version": "v2"},
        expect=dict(worker="none", version=None),
        warnings=(
            "speculative.algorithm is 'none', so speculative.num_steps, speculative.version is "
            "ignored; set speculative.algorithm to draft",
        ),
    ),
    Case(
        "nextn is an alias of eagle",
        spec(3, 4, 8, algorithm="nextn"),
        expect=dict(algorithm="eagle", version="v2", worker="eagle_v2", draft_path="/ckpt/draft"),
    ),
    Case(
        "eagle3 keeps explicit parameters",
        spec(4, 2, 7, algorithm="eagle3"),
        expect=dict(algorithm="eagle3", num_steps=4, topk=2, num_draft_tokens=7, worker="eagle_v2"),
    ),
    Case(
        "the Llama family defaults to five steps of beam width four",
        {"algorithm": "eagle"},
        expect=parameters(LLAMA_FAMILY_PARAMETERS),
    ),
    Case(
        "the DeepSeek family defaults to a short chain",
        {"algorithm": "eagle"},
        target=DEEPSEEK_V3,
        expect=parameters(DEEPSEEK_FAMILY_PARAMETERS),
    ),
    Case(
        "an MLA target of unknown name counts as the DeepSeek family",
        {"algorithm": "eagle"},
        target=UNKNOWN_MLA,
        expect=parameters(DEEPSEEK_FAMILY_PARAMETERS),
    ),
    Case(
        "other architectures get the conservative default",
        {"algorithm": "eagle"},
        target=QWEN2,
        expect=parameters(OTHER_PARAMETERS),
    ),
    Case(
        "a chain draft forces N to S + 1 and says so",
        spec(3, 1, 8, algorithm="eagle"),
        expect=dict(num_steps=3, topk=1, num_draft_tokens=4, worker="eagle_v2"),
        warnings=(
            "speculative.eagle_topk = 1 drafts a chain, so speculative.num_draft_tokens = 8 "
            "becomes num_steps + 1 = 4",
        ),
    ),
    Case(
        "a chain draft with N = S + 1 passes without a warning",
        spec(6, 1, 7, algorithm="eagle"),
        expect=dict(num_draft_tokens=7),
    ),
    Case(
        "a tree exactly as large as the draft allows is accepted",
        spec(3, 2, 11, algorithm="eagle"),
        expect=dict(num_draft_tokens=11, version="v2"),
    ),
    Case(
        "mtp reads its draft from the target checkpoint",
        spec(3, 1, 4, algorithm="mtp"),
        model=dict(TARGET_ONLY),
        target=DEEPSEEK_V3,
        expect=dict(algorithm="mtp", draft_path="/ckpt/target", worker="eagle_v2"),
    ),
    Case(
        "mtp with the draft path equal to the target path does not warn",
        spec(3, 1, 4, algorithm="mtp"),
        model={"target_path": "/ckpt/target", "draft_path": "/ckpt/target"},
        target=DEEPSEEK_V3,
        expect=dict(draft_path="/ckpt/target"),
    ),
    Case(
        "mtp with a separate draft path uses it and says so",
        spec(3, 1, 4, algorithm="mtp"),
        target=DEEPSEEK_V3,
        expect=dict(draft_path="/ckpt/draft"),
        warnings=(
            "speculative.algorithm = 'mtp' reads the MTP layers from model.draft_path = "
            "'/ckpt/draft', not from the target checkpoint",
        ),
    ),
    Case(
        "a single MTP layer may draft a tree on v2",
        spec(3, 2, 6, algorithm="mtp"),
        model=dict(TARGET_ONLY),
        target=DEEPSEEK_V32,
        expect=dict(version="v2", worker="eagle_v2", topk=2),
    ),
    Case(
        "several MTP layers select the multi-layer worker",
        spec(3, 1, 4, algorithm="mtp"),
        model=dict(TARGET_ONLY),
        target=MTP3,
        expect=dict(worker="multi_layer_eagle_v2", version="v2"),
    ),
    Case(
        "multi-layer MTP gets its chain length fixed before its checks",
        spec(2, 1, 5, algorithm="mtp"),
        model=dict(TARGET_ONLY),
        target=MTP3,
        expect=dict(worker="multi_layer_eagle_v2", num_draft_tokens=3),
        warnings=(
            "speculative.eagle_topk = 1 drafts a chain, so speculative.num_draft_tokens = 5 "
            "becomes num_steps + 1 = 3",
        ),
    ),
    Case(
        "a paged tree falls back to v1 with its reason",
        spec(3, 4, 8, algorithm="eagle"),
        memory={"page_size": 4, "max_running_requests": 16},
        expect=dict(version="v1", worker="eagle_v1", fallback_reason=PAGED_REASON),
        warnings=(
            f"speculative.version 'auto' falls back to v1 ({PAGED_REASON}); to run v2 set "
            "memory.page_size = 1 or speculative.eagle_topk = 1",
        ),
    ),
    Case(
        "a paged chain stays on v2",
        spec(3, 1, 4, algorithm="eagle"),
        memory={"page_size": 4, "max_running_requests": 16},
        expect=dict(version="v2", fallback_reason=None),
    ),
    Case(
        "a tree on a recurrent target falls back to v1 with its reason",
        spec(3, 4, 8, algorithm="eagle"),
        target=QWEN3_NEXT,
        expect=dict(version="v1", worker="eagle_v1", fallback_reason=RECURRENT_REASON),
        warnings=(
            f"speculative.version 'auto' falls back to v1 ({RECURRENT_REASON}); to run v2 set "
            "speculative.eagle_topk = 1",
        ),
    ),
    Case(
        "a chain on a recurrent target stays on v2",
        spec(3, 1, 4, algorithm="eagle"),
        target=QWEN3_NEXT,
        expect=dict(version="v2", worker="eagle_v2"),
    ),
    Case(
        "both fallback reasons are reported together",
        spec(3, 4, 8, algorithm="eagle"),
        memory={"page_size": 4, "max_running_requests": 16},
        target=QWEN3_NEXT,
        expect=dict(version="v1", fallback_reason=f"{PAGED_REASON}; {RECURRENT_REASON}"),
        warnings=(
            f"speculative.version 'auto' falls back to v1 ({PAGED_REASON}; {RECURRENT_REASON}); "
            "to run v2 set speculative.eagle_topk = 1",
        ),
    ),
    Case(
        "an explicit v1 is honoured without a fallback reason",
        spec(3, 4, 8, algorithm="eagle", version="v1"),
        expect=dict(version="v1", worker="eagle_v1", fallback_reason=None),
    ),
    Case(
        "an explicit v1 on a paged tree is no fallback",
        spec(3, 4, 8, algorithm="eagle", version="v1"),
        memory={"page_size": 4, "max_running_requests": 16},
        expect=dict(version="v1", fallback_reason=None),
    ),
    Case(
        "an explicit v2 runs where v2 can",
        spec(3, 4, 8, algorithm="eagle", version="v2"),
        expect=dict(version="v2", worker="eagle_v2"),
    ),
    Case(
        "an unset request limit becomes 48, a default like any other: no warning",
        spec(3, 4, 8, algorithm="eagle"),
        memory={},
        expect=dict(max_running_requests=48),
    ),
]
