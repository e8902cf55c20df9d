"""Tensor-parallel layers against the full-weight layer they shard, in one process: each rank's
shard is filled from the full layer's checkpoint (only its block is read) and run with the
collectives replaced by the identity; concatenating (column-parallel, lm_head) or summing
(row-parallel, embedding) the shards' outputs gives the full layer's output. The collectives
themselves run in tests/integration/parallel (two gloo processes)."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar, cast

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch import nn

from eagletree.adapters.models.loading import load_target
from eagletree.adapters.models.merged_linear import MergedLinear
from eagletree.adapters.models.random_checkpoint import write_random_checkpoint
from eagletree.adapters.models.random_checkpoint_config import Arch, ModelSizes
from eagletree.adapters.models.tensor_files import TensorFiles, fill_module, module_tensors
from eagletree.adapters.models.tensor_parallel import (
    FEW_ROWS,
    CheckpointShard,
    ColumnParallelLinear,
    RowParallelLinear,
    TensorParallel,
    VocabParallelEmbedding,
)
from eagletree.domain.errors import ConfigurationError

M = TypeVar("M", bound=nn.Module)
WORLD = 2
PLACEHOLDER_GROUP = cast("dist.ProcessGroup", object())  # never used: collectives are patched


@pytest.fixture(autouse=True)
def identity_collectives(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(TensorParallel, "all_reduce", lambda self, x: x)
    monkeypatch.setattr(TensorParallel, "all_gather_last", lambda self, x: x)


def ranks() -> list[TensorParallel]:
    return [TensorParallel(rank, WORLD, PLACEHOLDER_GROUP) for rank in range(WORLD)]


def checkpoint_of(module: nn.Module, path: Path) -> TensorFiles:
    path.mkdir()
    tensors = {name: t.detach().contiguous() for name, t in module_tensors(module).items()}
    save_file(tensors, str(path / "model.safetensors"))
    return TensorFiles(path)


def filled(shard: M, files: TensorFiles) -> M:
    fill_module(shard, files, lambda name: name, "shard")
    return shard


def test_column_parallel_shards_side_by_side_are_the_full_linear(tmp_path: Path) -> None:
    torch.manual_seed(0)
    full = nn.Linear(8, 12, bias=True)
    files = checkpoint_of(full, tmp_path / "ckpt")
    shards = [filled(ColumnParallelLinear(8, 12, True, tp), files) for tp in ranks()]
    x = torch.randn(5, 8)
    # (5, 12 / W) per rank -> (5, 12)
    torch.testing.assert_close(torch.cat([s(x) for s in shards], dim=-1), full(x))
    assert all(s.weight.shape == (6, 8) for s in shards)


def test_row_parallel_partial_products_sum_to_the_full_linear(tmp_path: Path) -> None:
    torch.manual_seed(1)
    full = nn.Linear(12, 8, bias=False)
    files = checkpoint_of(full, tmp_path / "ckpt")
    shards = [filled(RowParallelLinear(12, 8, False, tp), files) for tp in ranks()]
    x = torch.randn(5, 12)
    blocks = x.chunk(WORLD, dim=-1)  # a column-parallel layer's outputs, rank by rank
    partial = sum(s(block) for s, block in zip(shards, blocks, strict=True))
    torch.testing.assert_close(partial, full(x))


def test_row_parallel_bias_is_replicated_and_added_after_the_sum(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.manual_seed(2)
    full = nn.Linear(12, 8, bias=True)
    files = checkpoint_of(full, tmp_path / "ckpt")
    shard = filled(RowParallelLinear(12, 8, True, ranks()[1]), files)
    torch.testing.assert_close(shard.bias, full.bias)
    # a reduce over W ranks with equal partial products: W times each
    monkeypatch.setattr(TensorParallel, "all_reduce", lambda self, x: x * WORLD)
    x = torch.randn(3, 6)
    reduced = WORLD * nn.functional.linear(x, shard.weight)
    torch.testing.assert_close(shard(x), reduced + full.bias)


def test_vocab_parallel_embedding_lookups_sum_to_the_full_lookup(tmp_path: Path) -> None:
    torch.manual_seed(3)
    full = nn.Embedding(10, 4)
    files = checkpoint_of(full, tmp_path / "ckpt")
    shards = [filled(VocabParallelEmbedding(10, 4, tp), files) for tp in ranks()]
    ids = torch.tensor([0, 4, 5, 9, 5, 2])  # both halves of the vocabulary, a repeat
    looked_up = [s(ids) for s in shards]
    assert torch.equal(looked_up[0] + looked_up[1], full(ids))
    assert torch.equal(looked_up[0][2:4], torch.zeros(2, 4))  # ids 5, 9 are rank 1's


def test_merged_parts_hold_each_parts_block_of_rows(tmp_path: Path) -> None:
    torch.manual_seed(4)
    parts = (("q_proj", 8), ("k_proj", 4), ("v_proj", 4))
    full = MergedLinear(6, parts, bias=True)
    files = checkpoint_of(full, tmp_path / "ckpt")
    x = torch.randn(3, 6)
    full_q, full_k, full_v = full.split(full(x))
    for tp in ranks():
        shard = filled(MergedLinear(6, parts, bias=True, tp=tp), files)
        q, k, v = shard.split(shard(x))
        for got, want in ((q, full_q), (k, full_k), (v, full_v)):
            width = want.shape[-1] // WORLD
            torch.testing.assert_close(got, want[:, tp.rank * width : (tp.rank + 1) * width])


def test_a_size_the_group_does_not_divide_is_refused_naming_it() -> None:
    with pytest.raises(ConfigurationError, match=r"vocab_size = 11 is not divisible by the .* 2"):
        VocabParallelEmbedding(11, 4, ranks()[0])


def test_a_checkpoint_tensor_of_the_wrong_shape_names_the_block_it_should_fill(
    tmp_path: Path,
) -> None:
    files = checkpoint_of(nn.Linear(8, 10, bias=False), tmp_path / "ckpt")
    with pytest.raises(ConfigurationError, match=r"shape \[10, 8\].*expects \[6, 8\] as its block"):
        filled(ColumnParallelLinear(8, 12, False, ranks()[0]), files)


def test_a_shard_is_the_block_of_its_rank() -> None:
    shard = CheckpointShard(dim=1, block=1, num_blocks=3)
    full = torch.arange(2 * 9).view(2, 9)
    assert shard.local_shape((2, 9)) == (2, 3)
    assert torch.equal(full[shard.slices((2, 9))], full[:, 3:6])


@pytest.mark.parametrize("arch", ["llama", "deepseek-mla"])
def test_each_rank_of_a_target_loads_its_blocks_of_the_same_checkpoint(
    arch: Arch, tmp_path: Path
) -> None:
    sizes = ModelSizes(vocab_size=32, num_layers=1, tie_word_embeddings=arch == "llama")
    target_dir, _ = write_random_checkpoint(tmp_path, arch, None, sizes=sizes, dtype=torch.float32)
    full = module_tensors(load_target(target_dir, torch.float32, "cpu"))
    for tp in ranks():
        shard = load_target(target_dir, torch.float32, "cpu", tp=tp)
        tensors = module_tensors(shard)
        assert tensors.keys() == full.keys()
        for name, tensor in tensors.items():
            expected = full[name]
            for dim in range(expected.dim()):  # the block along the one dim that shrank
                if tensor.shape[dim] != expected.shape[dim]:
                    expected = expected.chunk(WORLD, dim)[tp.rank]
            assert torch.equal(tensor, expected), name
        head = shard.lm_head.weight
        assert (head is shard.embed_tokens.weight) == sizes.tie_word_embeddings
        assert head.shape == (sizes.vocab_size // WORLD, sizes.hidden_size)


@pytest.mark.parametrize("count", [1, 2, 8, FEW_ROWS, FEW_ROWS + 1, 40])
def test_an_unsharded_lookup_of_few_or_many_ids_is_nn_embeddings(count: int) -> None:
    torch.manual_seed(count)
    embedding = VocabParallelEmbedding(50, 6)
    ids = torch.randint(0, 50, (count,))
    got = embedding(ids)
    assert got.shape == (count, 6)
    assert torch.equal(got, nn.functional.embedding(ids, embedding.weight))
