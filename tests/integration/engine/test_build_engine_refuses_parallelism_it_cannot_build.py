"""build_engine and parallelism: data parallelism is sent to its own builder, tensor
parallelism outside a process group says how to launch."""

from __future__ import annotations

from pathlib import Path

import pytest

from eagletree.app.composition.container import build_engine


@pytest.mark.parametrize("tp", [1, 2])
def test_build_engine_sends_data_parallelism_to_the_data_parallel_builder(tp: int) -> None:
    pytest.importorskip("pydantic_settings")
    from eagletree.config.settings import EngineSettings
    from eagletree.domain.errors import ConfigurationError

    settings = EngineSettings(
        model={"target_path": "/nonexistent", "device": "cpu", "dtype": "float32"},
        parallel={"dp_size": 2, "tp_size": tp},
    )
    with pytest.raises(
        ConfigurationError, match=r"parallel\.dp_size = 2: .*build_data_parallel_engine"
    ):
        build_engine(settings)


def test_build_engine_with_tensor_parallelism_outside_a_process_group_says_how_to_launch(
    tmp_path: Path,
) -> None:
    pytest.importorskip("pydantic_settings")
    from eagletree.config.settings import EngineSettings
    from eagletree.domain.errors import ConfigurationError

    settings = EngineSettings(
        model={"target_path": str(tmp_path), "device": "cpu", "dtype": "float32"},
        parallel={"tp_size": 2},
    )
    with pytest.raises(
        ConfigurationError, match=r"parallel\.tp_size = 2 × parallel\.dp_size = 1 needs 2 proc"
    ):
        build_engine(settings)
