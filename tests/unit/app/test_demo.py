"""The demo step (the README's run command) emits the target's own tokens and compacts the KV."""

from __future__ import annotations

import pytest

from eagletree.app.cli.demo import (
    NUM_DRAFT_TOKENS,
    TARGET_ARGMAX,
    WINDOW_FIRST_SLOT,
    main,
    run_step,
)


def test_demo_emits_the_targets_greedy_continuation_along_the_tree(
    capsys: pytest.CaptureFixture[str],
) -> None:
    result = run_step()
    emitted = result["emitted"].tolist()
    # greedy walk by hand: the target picks 12 at the root (node 2), then 23 (node 4), then 40
    path_nodes = [0, 2, 4]
    assert emitted == [TARGET_ARGMAX[node] for node in path_nodes]
    # the window's first slots now hold the KV of the accepted nodes (payload = source slot)
    window = result["window_kv"].long().tolist()
    assert window[: len(path_nodes)] == [WINDOW_FIRST_SLOT + node for node in path_nodes]
    assert len(window) == NUM_DRAFT_TOKENS
    assert "emitted tokens" in capsys.readouterr().out


def test_demo_main_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    assert "new committed length" in capsys.readouterr().out
