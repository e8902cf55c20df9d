"""The checkpoint check: weight dtypes, index tensors, finite values, named file and tensor."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from eagletree.adapters.models.checkpoint_check import CheckpointCheck, check_tensors
from eagletree.domain.errors import ConfigurationError

FILE = Path("ckpt/model.safetensors")


@pytest.mark.parametrize(
    "dtype", [torch.int64, torch.int8, torch.uint8, torch.bool, torch.float8_e4m3fn]
)
def test_a_weight_that_is_not_a_supported_float_is_refused_naming_file_and_tensor(
    dtype: torch.dtype,
) -> None:
    check = CheckpointCheck()
    with pytest.raises(ConfigurationError, match=r"^ckpt/model.safetensors: tensor 'w' is "):
        check.tensor(FILE, "w", torch.zeros(2, dtype=dtype), weight=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_supported_weight_dtypes_pass(dtype: torch.dtype) -> None:
    check = CheckpointCheck()
    check.tensor(FILE, "w", torch.ones(3, dtype=dtype), weight=True)
    check.finish()


def test_index_tensors_are_integers_and_a_float_one_is_refused() -> None:
    check_tensors([(FILE, "d2t", torch.arange(4)), (FILE, "t2d", torch.ones(4, dtype=torch.bool))])
    with pytest.raises(ConfigurationError, match="tensor 'd2t' is float32, but it holds token ids"):
        check_tensors([(FILE, "d2t", torch.arange(4.0))])


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_the_first_tensor_with_a_value_that_is_not_finite_is_named(bad: float) -> None:
    good, broken = torch.ones(4, dtype=torch.bfloat16), torch.ones(4, dtype=torch.bfloat16)
    broken[2] = bad
    tensors = [(FILE, "a", good), (Path("ckpt/b.safetensors"), "b", broken), (FILE, "c", broken)]
    with pytest.raises(ConfigurationError) as error:
        check_tensors(tensors)
    assert str(error.value).startswith(
        "ckpt/b.safetensors: tensor 'b' holds NaN or infinite values"
    )
