"""Application: what one `eagletree bench` run builds: base settings, checkpoint, slot budget.

Without a settings file the defaults follow the device (CPU: float32 and the torch backends;
CUDA: bfloat16 and Triton); flags override either. The KV pool, the context and the number of
running requests are sized for the largest batch and the longest configuration (with
``--arrivals``, the background batch and every arrival at once), so that no request is
retracted or cut short while it is measured.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from eagletree.app.bench.arrivals import background_budget
from eagletree.app.bench.checkpoints import DraftKind, ensure_preset_checkpoint
from eagletree.app.bench.configs import BenchConfig
from eagletree.app.bench.measure import token_budget
from eagletree.config.sections import SpeculativeSettings
from eagletree.config.settings import EngineSettings
from eagletree.config.shape_policy import shape_spec
from eagletree.domain.draft_shape import reserved_slots
from eagletree.domain.errors import ConfigurationError


@dataclass(frozen=True, slots=True)
class BenchPlan:
    """The settings every engine of the run starts from, and where the checkpoint is."""

    base: EngineSettings
    target: Path
    draft: Path | None
    draft_kind: DraftKind
    cuda: bool


def plan_run(
    args: argparse.Namespace, configs: Sequence[BenchConfig], notify: Callable[[str], None]
) -> BenchPlan:
    """Settings and checkpoint for ``args`` (as ``bench_cli.parser()`` makes them); writes the
    preset's checkpoint first when it is missing."""
    base = EngineSettings.from_file(args.settings) if args.settings else EngineSettings()
    if args.token_map is not None:
        speculative = base.speculative.model_copy(update={"token_map": str(args.token_map)})
        base = base.model_copy(update={"speculative": speculative})
    from_file = base.model.device if args.settings else None
    device = args.device or (None if from_file == "auto" else from_file)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    cuda = torch.device(device).type == "cuda"
    if cuda and not torch.cuda.is_available():
        raise ConfigurationError(f"device {device!r} but no CUDA device is visible: --device cpu")
    by_device = not args.settings  # without a file the defaults follow the device

    def choose(flag: str | None, from_file: str, on_cpu: str, on_cuda: str) -> str:
        if flag is not None:
            return flag
        if not by_device:
            return from_file
        return on_cuda if cuda else on_cpu

    backend = base.backend
    model_update: dict[str, Any] = {
        "device": device,
        "dtype": choose(args.dtype, base.model.dtype, "float32", "bfloat16"),
    }
    backend_update = {
        "attention": choose(args.attention, backend.attention, "torch", "triton"),
        "kv_move": choose(args.kv_move, backend.kv_move, "torch", "triton"),
        "cuda_graph": args.cuda_graph or backend.cuda_graph,
    }
    draft_kind: DraftKind = args.draft or _draft_kind_of(base)
    if args.target is not None:
        target, draft = args.target, args.draft_dir
    elif args.preset is None and base.model.target_path is not None:
        target = Path(base.model.target_path)
        draft = None if base.model.draft_path is None else Path(base.model.draft_path)
    else:
        target, draft = ensure_preset_checkpoint(
            args.preset or "tiny",
            draft_kind,
            args.checkpoint_dir,
            device=device,
            notify=notify,
        )
    if not (target / "config.json").is_file():
        raise ConfigurationError(f"{target} holds no config.json: not a checkpoint directory")
    spec = [c for c in configs if c.speculative]
    most_per_step = max(c.max_tokens_per_step for c in configs)
    if args.arrivals is not None:  # the background batch outlasts the window; arrivals join it
        budget = background_budget(
            args.new_tokens, args.arrivals, args.num_arrivals, args.warmup_steps, most_per_step
        )
        extra_requests = args.num_arrivals
    else:
        budget = token_budget(args.new_tokens, args.warmup_steps, args.profile_steps, most_per_step)
        extra_requests = 0
    context = args.prompt_len + 1 + budget
    window = max([reserved_slots((c.shape, *c.candidates)) for c in spec] or [2])
    context = _within_positions(context, window, target, args, notify)
    max_bs = max([*args.batch_sizes, 1]) + extra_requests
    needed_slots = max_bs * (context + window + 16)
    memory_update = {
        "max_running_requests": max_bs,
        "max_total_tokens": max(needed_slots, base.memory.max_total_tokens)
        if args.settings
        else needed_slots,
    }
    model_update.update(
        target_path=str(target),
        draft_path=None if draft is None else str(draft),
        max_context_len=context + window,
    )
    settings = base.model_copy(
        update={
            "model": base.model.model_copy(update=model_update),
            "memory": base.memory.model_copy(update=memory_update),
            "backend": backend.model_copy(update=backend_update),
            "scheduler": base.scheduler.model_copy(
                update={
                    "overlap": args.overlap or base.scheduler.overlap,
                    "prefill_step": (args.prefill_step or [base.scheduler.prefill_step])[0],
                }
            ),
        }
    )
    return BenchPlan(settings, target, draft, draft_kind, cuda)


def _within_positions(
    context: int, window: int, target: Path, args: argparse.Namespace, notify: Callable[[str], None]
) -> int:
    """``context`` (prompt, the token budget's bound on what a request can emit while measured)
    cut to what the target's positions leave beside the widest shape's ``window``: the bound
    assumes a request that accepts every draft at every step, and a deep shape's (S 8: 9
    tokens a step) passes a 2k-position target at 256 new tokens. A request that does run that
    far ahead of its batch's slowest ends at the limit (the row counts it); a window whose
    prompt and new tokens alone do not fit is an error."""
    from eagletree.adapters.models.config import ConfigReader

    limit = ConfigReader.from_dir(target).get_int("max_position_embeddings", 2048)
    if context + window <= limit:
        return context
    least = args.prompt_len + 1 + args.new_tokens
    if least + window > limit:
        raise ConfigurationError(
            f"--prompt-len {args.prompt_len} + --new-tokens {args.new_tokens} and the widest "
            f"shape's window ({window} positions) exceed the target's max_position_embeddings "
            f"({limit}): lower --new-tokens or --prompt-len"
        )
    notify(
        f"contexts cut to the target's {limit} positions: a request that runs more than "
        f"{limit - window - least} tokens ahead of its batch's slowest ends there"
    )
    return limit - window


def _draft_kind_of(settings: EngineSettings) -> DraftKind:
    """The draft kind a settings file names (nextn is eagle), else EAGLE."""
    algorithm = settings.speculative.algorithm
    if algorithm in ("eagle3", "mtp"):
        return algorithm
    return "eagle"


def settings_for(plan: BenchPlan, config: BenchConfig) -> EngineSettings:
    """The run's base settings with the speculation of ``config`` (none for plain)."""
    if not config.speculative:
        speculative = SpeculativeSettings(algorithm="none")
    else:
        shape = config.shape
        speculative = SpeculativeSettings(
            algorithm=plan.draft_kind,
            num_steps=shape.num_steps,
            eagle_topk=shape.topk,
            num_draft_tokens=shape.num_draft_tokens,
            version=plan.base.speculative.version,
            token_map=plan.base.speculative.token_map,
            sampled_drafts=plan.base.speculative.sampled_drafts,
            policy="adaptive" if config.adaptive else "fixed",
            candidate_shapes=[shape_spec(s) for s in config.candidates]
            if config.adaptive
            else None,
        )
    return plan.base.model_copy(update={"speculative": speculative})
