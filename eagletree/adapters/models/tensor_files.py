"""Adapter: a checkpoint directory's safetensors (one file or a sharded index) and filling modules.

A tensor-parallel module (``ShardedParameters``) is filled shard by shard: only its rank's block
of each checkpoint tensor is read from the file.

Errors are ``ConfigurationError``s naming the directory or file, the tensor, and for shapes the
expected and the found shape.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn

from eagletree.adapters.models.checkpoint_check import CheckpointCheck
from eagletree.adapters.models.merged_linear import MergedLinear
from eagletree.adapters.models.tensor_parallel import CheckpointShard, ShardedParameters
from eagletree.domain.errors import ConfigurationError

INDEX_FILE = "model.safetensors.index.json"

# Maps a checkpoint name to a module name, or to None for a tensor the module does not own.
Rename = Callable[[str], str | None]


class TensorFiles:
    """Which file of a checkpoint directory holds each tensor (headers only; nothing is loaded)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._file_of: dict[str, Path] = {}
        index = self.path / INDEX_FILE
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError, TypeError) as error:
                raise ConfigurationError(f"{index}: not a safetensors index ({error})") from error
            for name, file in weight_map.items():
                self._file_of[name] = self.path / file
            missing = sorted({f for f in self._file_of.values() if not f.is_file()})
            if missing:
                raise ConfigurationError(f"{index}: lists missing shard(s) {missing[:3]}")
            return
        files = sorted(self.path.glob("*.safetensors"))
        if not files:
            others = sorted(p.name for p in self.path.glob("*.bin"))
            hint = f" (found {others[:2]}: convert them to safetensors)" if others else ""
            raise ConfigurationError(f"{self.path}: no *.safetensors weights{hint}")
        for file in files:
            with open_safetensors(file) as handle:
                for name in handle.keys():  # noqa: SIM118 - safe_open is not a mapping
                    self._file_of[name] = file

    def names(self) -> list[str]:
        return list(self._file_of)

    def file_of(self, name: str) -> Path:
        return self._file_of[name]

    def shapes(self, names: list[str]) -> dict[str, tuple[int, ...]]:
        """The shape of each named tensor, read from the file headers (each file opened once)."""
        shapes: dict[str, tuple[int, ...]] = {}
        for file, file_names in self._group_by_file(names).items():
            with open_safetensors(file) as handle:
                for name in file_names:
                    shapes[name] = tuple(handle.get_slice(name).get_shape())
        return shapes

    def _group_by_file(self, names: list[str]) -> dict[Path, list[str]]:
        by_file: dict[Path, list[str]] = {}
        for name in names:
            by_file.setdefault(self._file_of[name], []).append(name)
        return by_file

    def read(
        self,
        names: list[str],
        device: torch.device,
        shards: dict[str, CheckpointShard] | None = None,
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield (name, tensor on ``device``), opening each file once; a name in ``shards``
        yields only that block of its tensor (the rest is never read)."""
        shards = shards or {}
        for file, file_names in self._group_by_file(names).items():
            with ExitStack() as stack:
                handle: Any = stack.enter_context(open_safetensors(file, device))
                for name in file_names:
                    try:
                        shard = shards.get(name)
                        if shard is None:
                            tensor = handle.get_tensor(name)
                        else:
                            view = handle.get_slice(name)
                            tensor = view[shard.slices(tuple(view.get_shape()))]
                    except Exception as error:  # safetensors' SafetensorError is not exported
                        raise _unreadable(file, error) from None
                    yield name, tensor


def open_safetensors(file: Path, device: torch.device | None = None) -> Any:
    """``safe_open`` of one file; ConfigurationError naming it when it is not safetensors."""
    try:
        return safe_open(str(file), framework="pt", device=str(device or "cpu"))
    except Exception as error:  # SafetensorError (truncated or not safetensors) or OSError
        raise _unreadable(file, error) from None


def _unreadable(file: Path, error: Exception) -> ConfigurationError:
    return ConfigurationError(
        f"{file}: not a readable safetensors file ({error}); it may be truncated or "
        "corrupt: download or write it again"
    )


def module_tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter (tied ones once) and persistent buffer a checkpoint must fill, by
    checkpoint name: a ``MergedLinear``'s weight appears as the row views of its parts."""
    return {name: tensor for name, (tensor, _) in _checkpoint_entries(module).items()}


def _checkpoint_entries(
    module: nn.Module,
) -> dict[str, tuple[torch.Tensor, CheckpointShard | None]]:
    modules = dict(module.named_modules())
    entries: dict[str, tuple[torch.Tensor, CheckpointShard | None]] = {}
    for name, param in module.named_parameters():
        owner, _, attr = name.rpartition(".")
        sub = modules[owner]
        if isinstance(sub, MergedLinear):
            if attr == "weight":  # every part's weight and bias, in checkpoint order
                parent = owner.rpartition(".")[0]
                prefix = f"{parent}." if parent else ""
                entries.update(
                    (prefix + part, (view, shard)) for part, view, shard in sub.checkpoint_parts()
                )
        elif isinstance(sub, ShardedParameters):
            entries[name] = (param, sub.checkpoint_shard(attr))
        else:
            entries[name] = (param, None)
    persistent = module.state_dict(keep_vars=True)
    for name, buffer in module.named_buffers():
        if name in persistent:
            entries[name] = (buffer, None)
    return entries


def fill_module(
    module: nn.Module,
    files: TensorFiles,
    rename: Rename,
    what: str,
    optional: frozenset[str] = frozenset(),
) -> None:
    """Copy the checkpoint's tensors into ``module`` (converting dtype), checking every shape
    and the values (``checkpoint_check``).

    Every module tensor must be found exactly once, except ``optional`` ones (which the caller
    has initialised); a checkpoint tensor that ``rename`` maps to no module tensor is an error
    (a wrong architecture, usually).
    """
    entries = _checkpoint_entries(module)
    expected = {name: tensor for name, (tensor, _) in entries.items()}
    shards = {name: shard for name, (_, shard) in entries.items() if shard is not None}
    device = next(iter(expected.values())).device if expected else torch.device("cpu")
    source: dict[str, str] = {}
    unknown: list[str] = []
    for name in files.names():
        target = rename(name)
        if target is None:
            continue
        if target not in expected:
            unknown.append(name)
            continue
        if target in source:
            raise ConfigurationError(
                f"{files.path}: tensors {source[target]!r} and {name!r} both fill {target!r}"
            )
        source[target] = name
    if unknown:
        raise ConfigurationError(
            f"{files.path}: {len(unknown)} tensor(s) the {what} does not have, e.g. "
            f"{sorted(unknown)[:5]} (is this checkpoint of the right architecture?)"
        )
    missing = sorted(set(expected) - set(source) - optional)
    if missing:
        raise ConfigurationError(
            f"{files.path}: the {what} needs tensor(s) the checkpoint lacks: {missing[:8]}"
            + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        )
    shapes = files.shapes(list(source.values()))
    for target, name in source.items():
        got = shapes[name]
        want = tuple(expected[target].shape)
        shard = shards.get(target)
        got_local = shard.local_shape(got) if shard is not None and shard.divides(got) else got
        if got_local != want:
            block = (
                ""
                if shard is None
                else (
                    f" as its block {shard.block} of {shard.num_blocks} along dim {shard.dim}"
                    " (tensor parallelism)"
                )
            )
            raise ConfigurationError(
                f"{files.file_of(name)}: tensor {name!r} has shape {list(got)}, the {what}"
                f" expects {list(want)}{block}"
            )
    if device.type == "meta":  # a model built to check the names and shapes alone
        return
    by_name = {name: target for target, name in source.items()}
    read_shards = {name: shards[target] for target, name in source.items() if target in shards}
    check = CheckpointCheck()  # dtypes and finite values; shapes were checked above
    with torch.no_grad():
        for name, tensor in files.read(list(by_name), device, read_shards):
            destination = expected[by_name[name]]
            check.tensor(files.file_of(name), name, tensor, destination.is_floating_point())
            destination.copy_(tensor)
    check.finish()
