"""Application: where a profiled decode step left the device idle.

The GPU-busy share says how much of a step the device worked, not why it stopped. Gaps between
device activities are of two kinds: the few microseconds between one kernel's end and the next
one's start inside a graph replay or a back-to-back launch stream (the price of each launch,
lowered only by fewer kernels), and longer waits where the device had nothing queued because
the host had not launched the next work yet (scheduling, input buffers, a read-back). The
threshold between them is ``SHORT_GAP_US``: a graph replays its kernels 0.5–2 µs apart on an
H100/H200, a host round trip takes tens of microseconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

SHORT_GAP_US = 5.0


@dataclass(frozen=True, slots=True)
class DeviceGaps:
    """Per-step idle time of the device between its first and last activity of a profile."""

    between_kernels_ms: float  # gaps of at most SHORT_GAP_US
    between_kernels: float  # how many, per step
    host_wait_ms: float  # longer gaps
    host_waits: float
    # the activities after which the device waited longest: (name, waited ms per step)
    waits_after: tuple[tuple[str, float], ...] = ()

    @property
    def idle_ms(self) -> float:
        return self.between_kernels_ms + self.host_wait_ms


def device_gaps(
    activities: Sequence[tuple[float, float, str]],
    num_steps: int,
    short_gap_us: float = SHORT_GAP_US,
    limit: int = 4,
) -> DeviceGaps:
    """Gaps between ``activities`` — (start µs, end µs, name) of every kernel, copy and memset
    in the profile, on any stream — averaged over ``num_steps``. Overlapping activities count
    as one busy span; a gap belongs to the activity whose end opened it."""
    if num_steps <= 0:
        raise ValueError(f"device_gaps needs at least one step, got num_steps={num_steps}")
    short_us = short_count = long_us = long_count = 0.0
    waits: dict[str, float] = {}
    ordered = sorted(activities)
    if ordered:
        busy_until, last_name = ordered[0][1], ordered[0][2]
        for start, end, name in ordered[1:]:
            gap = start - busy_until
            if gap > short_gap_us:
                long_us, long_count = long_us + gap, long_count + 1
                waits[last_name] = waits.get(last_name, 0.0) + gap
            elif gap > 0:
                short_us, short_count = short_us + gap, short_count + 1
            if end > busy_until:
                busy_until, last_name = end, name
    ranked = sorted(waits.items(), key=lambda item: -item[1])[:limit]
    per_step = 1000.0 * num_steps  # µs over the profile -> ms per step
    return DeviceGaps(
        between_kernels_ms=short_us / per_step,
        between_kernels=short_count / num_steps,
        host_wait_ms=long_us / per_step,
        host_waits=long_count / num_steps,
        waits_after=tuple((name[:80], us / per_step) for name, us in ranked),
    )
