"""Settings: the sections of EngineSettings, one frozen pydantic model each.

``settings.EngineSettings`` composes them and reads them from files and EAGLETREE_* variables.
"""

from __future__ import annotations

import typing
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

DTypeName = Literal["auto", "bfloat16", "float16", "float32"]
AlgorithmName = Literal["none", "eagle", "eagle3", "mtp", "nextn"]
VersionName = Literal["auto", "v1", "v2"]
AttentionBackendName = Literal["auto", "torch", "triton", "flash"]
KVMoveName = Literal["auto", "torch", "triton"]
CudaGraphName = Literal["auto", "on", "off"]
OverlapName = Literal["auto", "on", "off"]
PrefillStepName = Literal["with_decode", "alone"]
ShapePolicyName = Literal["fixed", "adaptive"]
SampledDraftsName = Literal["auto", "drawn", "top_k"]
# "auto" (CUDA when visible, else the CPU), "cpu", "cuda" or "cuda:N"
DEVICE_PATTERN = r"^(auto|cpu|cuda(:[0-9]+)?)$"


class _Section(BaseModel):
    # extra="forbid": a misspelt key is an error that lists the known ones, never ignored.
    model_config = ConfigDict(frozen=True, extra="forbid")

    @field_validator("*", mode="before")
    @classmethod
    def _no_bools_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        # pydantic reads true as 1; a boolean where a number belongs is a mistake, not a size.
        field = cls.model_fields.get(info.field_name or "")
        if isinstance(value, bool) and field is not None and _is_numeric(field.annotation):
            raise ValueError("a number is expected, not a boolean")
        return value


def _is_numeric(annotation: Any) -> bool:
    if annotation in (int, float):
        return True
    return any(arg in (int, float) for arg in typing.get_args(annotation))


class ModelSettings(_Section):
    target_path: str | None = Field(
        default=None, description="Target checkpoint directory (config.json + safetensors)."
    )
    draft_path: str | None = Field(
        default=None,
        description="Draft checkpoint directory; for algorithm mtp it defaults to target_path.",
    )
    dtype: DTypeName = Field(
        default="auto",
        description="Weight and KV cache dtype; auto: bfloat16 on CUDA, else float32.",
    )
    device: str = Field(
        default="auto",
        pattern=DEVICE_PATTERN,
        description='"auto" (CUDA when visible, else the CPU), "cpu", "cuda" or "cuda:N".',
    )
    max_context_len: int | None = Field(
        default=None,
        gt=0,
        description="Longest request (prompt + output); unset: the target's position limit.",
    )


class SpeculativeSettings(_Section):
    algorithm: AlgorithmName = Field(
        default="none", description="Draft algorithm; nextn is an alias of eagle."
    )
    num_steps: int | None = Field(default=None, ge=1, description="Draft depth S.")
    eagle_topk: int | None = Field(default=None, ge=1, description="Beam width k per draft step.")
    num_draft_tokens: int | None = Field(
        default=None, ge=2, description="Tree size N including the root."
    )
    version: VersionName = Field(
        default="auto", description="Worker generation; auto picks v2 unless it cannot run."
    )
    token_map: str | None = Field(
        default=None,
        description="EAGLE only: a file of the target token ids the head proposes from (.pt "
        "tensor, as FR-Spec publishes them, or .json list); its lm_head keeps those rows.",
    )
    policy: ShapePolicyName = Field(
        default="fixed",
        description="fixed: every step drafts (num_steps, eagle_topk, num_draft_tokens); "
        "adaptive: every step the fastest of candidate_shapes for its batch (v2 trees).",
    )
    candidate_shapes: list[str] | None = Field(
        default=None,
        description='adaptive only: "plain", "chain:S<n>" or "tree:S<n>,k<n>,N<n>" each; '
        "unset: plain, chains S3/S5/S7, trees S5 k4 N8/N16, S8 k4 N32, S8 k8 N64.",
    )
    sampled_drafts: SampledDraftsName = Field(
        default="auto",
        description="How a sampling request's drafts are chosen: drawn draws each node's "
        "children from the head's distribution at the request's temperature, top-k and top-p "
        "(without replacement) and verifies them by rejection sampling against it (lossless; "
        "accepts more where the target spreads its probability); top_k takes the head's k "
        "likeliest tokens (a chain: its argmax), verified target-only. auto: drawn on the tree "
        "workers (EAGLE, EAGLE-3, one MTP layer), top_k on the multi-layer MTP worker (which "
        "drafts the argmax only).",
    )


class MemorySettings(_Section):
    page_size: int = Field(default=1, ge=1, description="Tokens per KV page.")
    max_total_tokens: int = Field(
        default=65_536, gt=0, description="KV slots in the shared token pool."
    )
    max_running_requests: int | None = Field(
        default=None, ge=1, description="Concurrent requests; unset: 48."
    )
    debug_checks: bool = Field(
        default=False,
        description="Check slot ranges, frees and moves on accelerators too (synchronises).",
    )


class BackendSettings(_Section):
    attention: AttentionBackendName = Field(
        default="auto", description="Attention backend; auto: triton on CUDA, torch on the CPU."
    )
    kv_move: KVMoveName = Field(
        default="auto", description="KV row move implementation; auto: as backend.attention."
    )
    cuda_graph: CudaGraphName = Field(
        default="auto",
        description="Capture decode steps in CUDA graphs; auto: on for CUDA devices, else off.",
    )
    cpu_threads: int | Literal["auto"] = Field(
        default="auto",
        description="torch's CPU threads for an engine on the CPU (process-wide); auto: "
        "OMP_NUM_THREADS when set, else one per 1024 hidden units of the target, at most the "
        "cores.",
    )

    @field_validator("cpu_threads", mode="before")
    @classmethod
    def _auto_or_threads(cls, value: Any) -> Any:
        # one message for both members of the union, not one per member
        if value == "auto" or isinstance(value, bool):
            return value  # a boolean is refused by _no_bools_for_numbers
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value)
        if not isinstance(value, int) or value < 1:
            raise ValueError("expected 'auto' or a number of threads >= 1")
        return value


class SchedulerSettings(_Section):
    overlap: OverlapName = Field(
        default="auto",
        description="Launch step i + 1 before reading step i's tokens; auto: on for the v2 "
        "and plain workers on CUDA, else off.",
    )
    prefill_step: PrefillStepName = Field(
        default="with_decode",
        description="Run a plan's prefills in the step of its decode batch (with_decode) or "
        "in a step of their own while the running requests wait one step (alone).",
    )


class ParallelSettings(_Section):
    dp_size: int = Field(
        default=1,
        ge=1,
        description="Data-parallel replicas, each with its own requests and KV pool.",
    )
    tp_size: int = Field(default=1, ge=1, description="Tensor-parallel ranks.")
    shard_dense_over_dp: bool = Field(
        default=False,
        description="With dp_size > 1: shard the MLP, embedding and lm_head over the "
        "data-parallel ranks (attention stays per rank).",
    )
