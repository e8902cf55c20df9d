"""The `eagletree init-random` command: write a random target and draft checkpoint.

For tests, examples and benchmarks: the formats are those ``eagletree`` loads (HF targets,
SafeAILab / SpecForge EAGLE heads, NextN MTP layers), at tiny or Llama-3.1-8B dimensions.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagletree.adapters.models.random_checkpoint import write_random_checkpoint
from eagletree.adapters.models.random_checkpoint_config import (
    PRESETS,
    Arch,
    Draft,
    ModelSizes,
    sizes_with,
)
from eagletree.app.composition.factories import torch_dtype
from eagletree.domain.errors import ConfigurationError

if TYPE_CHECKING:
    import torch

_SIZE_OPTIONS: dict[str, type] = {
    "vocab_size": int,
    "hidden_size": int,
    "intermediate_size": int,
    "num_layers": int,
    "num_heads": int,
    "num_kv_heads": int,
    "head_dim": int,
    "max_position_embeddings": int,
    "q_lora_rank": int,
    "kv_lora_rank": int,
    "qk_nope_head_dim": int,
    "qk_rope_head_dim": int,
    "v_head_dim": int,
    "draft_vocab_size": int,
    "num_mtp_layers": int,
}


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``init-random`` on an ``argparse`` sub-parser collection."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "init-random",
        help="write a random target (and draft) checkpoint",
        description="Write DIR/target and DIR/draft: random weights in the published formats.",
    )
    parser.add_argument("--arch", required=True, choices=["llama", "deepseek-mla"])
    parser.add_argument("--draft", choices=["eagle", "eagle3", "mtp"], help="omit: target only")
    parser.add_argument("--out", required=True, metavar="DIR", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        default="tiny",
        help="base dimensions; llama3-8b is Llama-3.1-8B (16 GB in bf16) (default: %(default)s)",
    )
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--device", default="cpu", help="where random numbers are drawn")
    parser.add_argument("--std", type=float, default=0.02, help="weight standard deviation")
    parser.add_argument("--tie-word-embeddings", action="store_true", default=None)
    parser.add_argument("--force", action="store_true", help="overwrite DIR/target and DIR/draft")
    parser.add_argument(
        "--tokenizer",
        action="store_true",
        help="also write a byte-level tokenizer with a chat template into DIR/target "
        "(needs --vocab-size >= 259), as the embedded default has",
    )
    sizes = parser.add_argument_group("size options (override the preset)")
    for name, kind in _SIZE_OPTIONS.items():
        sizes.add_argument(f"--{name.replace('_', '-')}", type=kind, metavar="N")
    # --q-lora-rank 0: no q LoRA
    parser.set_defaults(run=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Write the checkpoint(s); 0 on success, 1 with a message on stderr for bad options."""
    try:
        if args.preset == "llama3-8b" and args.arch != "llama":
            raise ConfigurationError("--preset llama3-8b describes a Llama model: use --arch llama")
        overrides = {name: getattr(args, name) for name in _SIZE_OPTIONS}
        overrides["tie_word_embeddings"] = args.tie_word_embeddings
        sizes: ModelSizes = sizes_with(PRESETS[args.preset], **overrides)
        check_sizes(args.arch, args.draft, sizes)
        if args.tokenizer and sizes.vocab_size < 259:
            raise ConfigurationError(
                f"--tokenizer needs --vocab-size >= 259 (256 bytes and 3 special tokens), "
                f"got {sizes.vocab_size}"
            )
        if args.q_lora_rank == 0:  # 0 means no q LoRA: q_proj straight from the hidden state
            sizes = dataclasses.replace(sizes, q_lora_rank=None)
        if args.out.exists() and not args.out.is_dir():
            raise ConfigurationError(f"--out {args.out} is a file: name a directory")
        check_device(args.device)
        check_room(args.arch, args.draft, sizes, torch_dtype(args.dtype), args.out)
        existing = [p for p in (args.out / "target", args.out / "draft") if p.exists()]
        if existing and not args.force:
            raise ConfigurationError(f"{existing[0]} exists (pass --force to overwrite it)")
        for path in existing:  # stale shards of an earlier checkpoint would shadow the new one
            shutil.rmtree(path)
        try:
            target_dir, draft_dir = write_random_checkpoint(
                args.out,
                args.arch,
                args.draft,
                seed=args.seed,
                sizes=sizes,
                dtype=torch_dtype(args.dtype),
                device=args.device,
                std=args.std,
            )
        except (RuntimeError, MemoryError, OSError) as error:  # the estimate was not enough
            raise ConfigurationError(
                f"cannot write the checkpoint to {args.out} ({type(error).__name__}: "
                f"{str(error).splitlines()[0] if str(error) else 'no message'}): lower the sizes"
            ) from None
        if args.tokenizer:
            from eagletree.adapters.text.byte_tokenizer import write_byte_level_tokenizer

            write_byte_level_tokenizer(target_dir, sizes.vocab_size)
    except (ConfigurationError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"target ({args.arch}, {args.preset}): {target_dir} ({_size(target_dir)})")
    if draft_dir is not None:
        print(f"draft ({args.draft}): {draft_dir} ({_size(draft_dir)})")
    return 0


# Sizes every model reads; MLA ones only for deepseek-mla (flag name, field).
_COMMON_SIZES = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_layers",
    "num_heads",
    "max_position_embeddings",
)
_LLAMA_SIZES = ("num_kv_heads", "head_dim")
_MLA_SIZES = ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


def check_sizes(arch: str, draft: str | None, sizes: ModelSizes) -> None:
    """ConfigurationError naming the flag for sizes no model could load."""

    def flag(name: str) -> str:
        return "--" + name.replace("_", "-")

    names = _COMMON_SIZES + (_LLAMA_SIZES if arch == "llama" else _MLA_SIZES)
    if draft == "eagle3":
        names += ("draft_vocab_size",)
    for name in names:
        value = getattr(sizes, name)
        if value < 1:
            raise ConfigurationError(f"{flag(name)} {value}: must be at least 1")
    if sizes.vocab_size < 3:
        raise ConfigurationError(
            f"--vocab-size {sizes.vocab_size}: the checkpoint declares BOS = 1 and EOS = 2, so "
            "it needs at least 3 tokens"
        )
    rope_dim = (
        ("head_dim", sizes.head_dim)
        if arch == "llama"
        else (
            "qk_rope_head_dim",
            sizes.qk_rope_head_dim,
        )
    )
    if rope_dim[1] % 2:
        raise ConfigurationError(
            f"{flag(rope_dim[0])} {rope_dim[1]}: rotary embeddings rotate pairs of dimensions, "
            "so it must be even"
        )
    if arch == "llama" and sizes.num_heads % sizes.num_kv_heads:
        raise ConfigurationError(
            f"--num-heads {sizes.num_heads} is not a multiple of --num-kv-heads "
            f"{sizes.num_kv_heads}"
        )
    if sizes.q_lora_rank is not None and sizes.q_lora_rank < 0:
        raise ConfigurationError(f"--q-lora-rank {sizes.q_lora_rank}: must be >= 0 (0: none)")
    if draft == "mtp":
        if arch != "deepseek-mla":
            raise ConfigurationError(
                "--draft mtp needs a target with MTP layers: use --arch deepseek-mla, or "
                "--draft eagle / eagle3 for a llama target"
            )
        if sizes.num_mtp_layers < 1:
            raise ConfigurationError(f"--num-mtp-layers {sizes.num_mtp_layers}: mtp needs >= 1")
    if draft == "eagle3" and sizes.draft_vocab_size > sizes.vocab_size:
        raise ConfigurationError(
            f"--draft-vocab-size {sizes.draft_vocab_size} exceeds --vocab-size {sizes.vocab_size}"
        )


def check_device(name: str) -> None:
    """``--device`` names a device of this machine that can draw random numbers."""
    import torch

    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigurationError(
            f"--device {name!r} is not a device: use cpu (the default) or cuda"
        ) from None
    if device.type not in ("cpu", "cuda"):
        raise ConfigurationError(f"--device {name!r}: random weights are drawn on cpu or cuda")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device.type == "cuda" and (count == 0 or (device.index or 0) >= count):
        visible = "no CUDA device is" if count == 0 else f"only {count} CUDA device(s) are"
        raise ConfigurationError(
            f"--device {name} but {visible} visible: use --device cpu (the default)"
        )


def check_room(
    arch: Arch, draft: Draft | None, sizes: ModelSizes, dtype: torch.dtype, out: Path
) -> None:
    """The checkpoint of ``sizes`` fits in memory while it is written and on the disk of
    ``out``; ConfigurationError with both figures otherwise."""
    from eagletree.adapters.models.random_checkpoint import checkpoint_layout

    try:
        target, drafted = checkpoint_layout(arch, draft, sizes)
    except (RuntimeError, OverflowError) as error:  # a numel past int64
        raise ConfigurationError(
            f"these sizes describe tensors too large to exist ({error}): lower the sizes"
        ) from None
    numels = [t.numel() for t in (*target.values(), *drafted.values())]
    on_disk = sum(numels) * dtype.itemsize
    # a shard of at most 4 GiB is built in memory, its largest tensor drawn in float32 first
    in_memory = min(on_disk, 4 << 30) + max(numels, default=0) * 4
    available = _available_memory()
    if available is not None and in_memory > available:
        raise ConfigurationError(
            f"the checkpoint of these sizes needs {_gib(in_memory)} of memory while it is "
            f"written ({_gib(max(numels) * 4)} for its largest tensor) and "
            f"{_gib(available)} are available: lower the sizes"
        )
    existing = next(p for p in (out, *out.parents) if p.exists())
    free = shutil.disk_usage(existing).free
    if on_disk > free:
        raise ConfigurationError(
            f"the checkpoint of these sizes takes {_gib(on_disk)} and {existing} has "
            f"{_gib(free)} free: lower the sizes or write it elsewhere (--out)"
        )


def _available_memory() -> int | None:
    """MemAvailable of /proc/meminfo in bytes (None where there is none)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def _gib(num_bytes: int) -> str:
    if num_bytes < 2**30:
        return f"{num_bytes / 2**20:.1f} MiB"
    return f"{num_bytes / 2**30:.1f} GiB"


def _size(directory: Path) -> str:
    total = sum(f.stat().st_size for f in directory.glob("*.safetensors"))
    return f"{total / 2**20:.1f} MiB" if total < 2**30 else f"{total / 2**30:.2f} GiB"


def main(argv: list[str] | None = None) -> int:
    """Run ``init-random`` on its own (``python -m eagletree.app.cli.init_random ...``)."""
    parser = argparse.ArgumentParser(prog="eagletree")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["init-random", *(sys.argv[1:] if argv is None else argv)])
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
