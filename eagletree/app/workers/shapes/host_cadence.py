"""How the adaptive policy spreads its host work over a large batch's steps: a pricing stands
for more steps, and one step in several is recorded with as many more paths."""

from __future__ import annotations

# the most steps a pricing's or a record's host work is spread over
MAX_STRIDE = 4


class HostCadence:
    """The steps a pricing's host work is spread over and the requests each record samples, by
    batch size.

    A batch of k × ``rows_per_stride`` requests (k ≤ ``MAX_STRIDE``) is priced k times as
    rarely as a small one (``stride``) and recorded one step in k, ``observe_per_step`` requests
    a step taken from that one: the same paths a step, the per-call host work of a pricing or a
    record spread over k steps. Where a small model's loop is host-bound (bs 32–64) every host
    microsecond lengthens its steps, and there the policy cost 83 µs a step on the H100's host;
    a pricing then stands for as many requests as at bs 16. A record's sample rotates through
    the batch, so that each temperature band is sampled in proportion to its share."""

    def __init__(self, *, observe_per_step: int, rows_per_stride: int) -> None:
        self._observe_per_step = observe_per_step
        self._rows_per_stride = rows_per_stride
        self._next_row = 0  # where the next record's sample starts in the batch
        self._unrecorded = 0  # steps read back since the last record

    def stride(self, batch_size: int) -> int:
        """The steps one pricing's and one record's host work is spread over."""
        return min(max(batch_size // self._rows_per_stride, 1), MAX_STRIDE)

    def sample(self, batch_size: int, *, now: bool) -> tuple[list[int], float] | None:
        """One more step read back: the batch indices to record now and the steps their paths
        are worth (``observe_per_step`` paths a step: the steps since the last record, fewer
        where the batch holds fewer requests than that), or None while the step waits for its
        stride's last; ``now``: record this step whatever the stride (a probe's paths decide
        the next step).

        The profiles forget by this worth, so by paths read rather than steps taken: on the
        real pair at bs 1, a half-life of 64 steps averaged a quarter of the paths a larger
        batch's did, and the shape chosen followed the noise (docs/speculative.md)."""
        self._unrecorded += 1
        if self._unrecorded < self.stride(batch_size) and not now:
            return None
        steps, self._unrecorded = self._unrecorded, 0
        count = min(self._observe_per_step * steps, batch_size)
        worth = count / self._observe_per_step
        start = self._next_row % batch_size
        end = self._next_row = start + count
        if end <= batch_size:
            return list(range(start, end)), worth
        return [*range(start, batch_size), *range(end - batch_size)], worth  # wrapped once
