"""Per-request sampling of next tokens: each request's parameters and its own coin stream.

Coins come from the request's counter-based Philox stream (``domain.coins``): a worker reserves
them on the host (``Request.take_coins``) and computes them on the device from (seed, offset),
so a request samples the same tokens alone or in any batch, eagerly or from a CUDA graph.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from eagletree.app.engine.transfers import to_device
from eagletree.domain.sampling import filtered_probs, tempered_probs

if TYPE_CHECKING:
    from eagletree.app.workers.step_kernels import CoinSource, StepKernels, TemperedProbs
    from eagletree.domain.request import Request


class SamplingMode(enum.Enum):
    """What a batch's sampling needs, known on the host (each its own CUDA graph variant)."""

    GREEDY = "greedy"  # every request takes the argmax
    SAMPLED = "sampled"  # some sample, none cuts its distribution: no sort over the vocabulary
    FILTERED = "filtered"  # some cut theirs with top-k or top-p


def sampling_mode(requests: Sequence[Request]) -> SamplingMode:
    """The mode a batch of ``requests`` runs in."""
    # ``not params.greedy``, without a property call per request of every step's batch
    sampling = [r.params for r in requests if r.params.temperature != 0.0]
    if not sampling:
        return SamplingMode.GREEDY
    if any(p.top_k or (p.top_p is not None and p.top_p < 1.0) for p in sampling):
        return SamplingMode.FILTERED
    return SamplingMode.SAMPLED


@dataclass(frozen=True, slots=True)
class SamplingInputs:
    """The sampling parameters of a batch's requests as device tensors, one row per request.

    ``mode`` is host knowledge: GREEDY picks the argmax path; otherwise every row goes through
    its temperature — and, FILTERED, its top-k and top-p (0 and 1 keep all) — greedy rows as
    one-hot distributions, so one code path serves any mix of requests.
    """

    temperature: torch.Tensor  # (bs,) float32; 0 = greedy
    top_k: torch.Tensor  # (bs,) int64, 0 = keep all
    top_p: torch.Tensor  # (bs,) float32, 1 = keep all
    seeds: torch.Tensor  # (bs,) int64 coin stream keys
    coin_offsets: torch.Tensor  # (bs,) int64 first coin of this step in each stream
    mode: SamplingMode

    @property
    def all_greedy(self) -> bool:
        return self.mode is SamplingMode.GREEDY

    @property
    def batch_size(self) -> int:
        return int(self.temperature.shape[0])

    def probs(
        self,
        logits: torch.Tensor,
        rows_per_request: int = 1,
        tempered: TemperedProbs = tempered_probs,
        *,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(bs·rows_per_request, V) float32 distributions; row r uses request r // rows's
        parameters (one-hot argmax rows for greedy requests), written into ``out`` where given
        (as ``tempered``'s). ``tempered``: the tempered softmax (``StepKernels.tempered_probs``);
        the filters cut what it made, so a row's distribution is the same bits whether or not
        its batch filters."""
        r = rows_per_request
        probs = tempered(logits, self.temperature.repeat_interleave(r), out=out)
        if self.mode is not SamplingMode.FILTERED:  # nothing to cut: no sort of the vocabulary
            return probs
        top_k, top_p = self.top_k.repeat_interleave(r), self.top_p.repeat_interleave(r)
        filtered = filtered_probs(probs, top_k, top_p)
        return filtered if out is None else out.copy_(filtered)

    def coins(self, source: CoinSource, count: int) -> torch.Tensor:
        """(bs, count) this step's coins of every request (greedy rows get unused coins)."""
        return source(self.seeds, self.coin_offsets, count)


def sampling_rows(
    requests: Sequence[Request], num_coins: int, mode: SamplingMode | None = None
) -> tuple[list[int], list[float]]:
    """Host values of ``SamplingInputs`` for ``requests``: ints (top_k, seed, coin offset per
    request, concatenated by field) and floats (temperature, top_p). Reserves ``num_coins``
    coins of every sampling request (greedy requests take none). ``mode``: the batch's
    ``sampling_mode``, where the caller knows it: a GREEDY batch reads none of these values,
    so they are the neutral ones, written without a walk over the requests."""
    if mode is SamplingMode.GREEDY:
        bs = len(requests)
        return [0] * (3 * bs), [0.0] * bs + [1.0] * bs
    top_k, seeds, offsets, temperature, top_p = [], [], [], [], []
    for request in requests:
        params = request.params
        top_k.append(params.top_k or 0)
        temperature.append(params.temperature)
        top_p.append(1.0 if params.top_p is None else params.top_p)
        if params.greedy:
            seeds.append(0)
            offsets.append(0)
        else:
            seeds.append(request.coin_seed)
            offsets.append(request.take_coins(num_coins))
    return top_k + seeds + offsets, temperature + top_p


def sampling_inputs(
    requests: Sequence[Request], num_coins: int, device: torch.device
) -> SamplingInputs:
    """Device ``SamplingInputs`` of ``requests``, reserving ``num_coins`` coins of each sampling
    request (two host-to-device copies that do not wait for the device)."""
    ints, floats = sampling_rows(requests, num_coins)
    bs = len(requests)
    int_rows = to_device(torch.tensor(ints, dtype=torch.int64).view(3, bs), device)
    float_rows = to_device(torch.tensor(floats, dtype=torch.float32).view(2, bs), device)
    return SamplingInputs(
        temperature=float_rows[0],
        top_k=int_rows[0],
        top_p=float_rows[1],
        seeds=int_rows[1],
        coin_offsets=int_rows[2],
        mode=sampling_mode(requests),
    )


def sample_tokens(
    logits: torch.Tensor, sampling: SamplingInputs, kernels: StepKernels
) -> torch.Tensor:
    """Next token of each request, (bs,) int64 on the logits' device; no host sync.

    ``logits``: (bs, V), row i belongs to request i. An all-greedy batch takes the argmax
    directly (the same token as the one-hot path: both pick the first maximum); otherwise one
    coin per request.
    """
    if sampling.all_greedy:
        return kernels.argmax(logits)
    probs = sampling.probs(logits, tempered=kernels.tempered_probs)
    return kernels.sample(probs, sampling.coins(kernels.coins, 1)[:, 0])


def sample_next_tokens(
    logits: torch.Tensor, requests: Sequence[Request], kernels: StepKernels
) -> torch.Tensor:
    """``sample_tokens`` for ``requests`` (reserving one coin of each sampling request)."""
    return sample_tokens(logits, sampling_inputs(requests, 1, logits.device), kernels)
