"""The movers ``benchmarks.kv_move`` compares: the three of its main table (``DEFAULT``), and
the Triton mover's other launch settings that ``--variants`` adds (``TUNING``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from eagletree.adapters.memory.row_movers import TorchRowMover, TritonRowMover

Mover = TorchRowMover | TritonRowMover


class Variant(NamedTuple):
    make: Callable[[], Mover]
    grouped: bool  # passes independent_groups=STEPS_PLUS_ONE (rows where the promise holds)


DEFAULT = {
    "torch": Variant(TorchRowMover, grouped=False),
    "triton": Variant(TritonRowMover, grouped=False),
    "grouped": Variant(TritonRowMover, grouped=True),
}
TUNING = {
    # grouped: pairs staged per program (whole groups of 6), register block, warps, tile
    "grouped lanes=8": Variant(lambda: TritonRowMover(group_lanes=8), grouped=True),
    "grouped lanes=16": Variant(lambda: TritonRowMover(group_lanes=16), grouped=True),
    "grouped lanes=64": Variant(lambda: TritonRowMover(group_lanes=64), grouped=True),
    "grouped regs=4096": Variant(lambda: TritonRowMover(register_words=4096), grouped=True),
    "grouped regs=16384": Variant(lambda: TritonRowMover(register_words=16384), grouped=True),
    "grouped warps=4": Variant(lambda: TritonRowMover(num_warps=4), grouped=True),
    "grouped warps=16": Variant(lambda: TritonRowMover(num_warps=16), grouped=True),
    "grouped tile=64": Variant(lambda: TritonRowMover(tile_words=64), grouped=True),
    "grouped tile=512": Variant(lambda: TritonRowMover(tile_words=512), grouped=True),
    # small moves: tiles as wide as the register block allows (few programs), or >= 128 programs
    "grouped min_programs=1": Variant(lambda: TritonRowMover(min_programs=1), grouped=True),
    "grouped min_programs=128": Variant(lambda: TritonRowMover(min_programs=128), grouped=True),
    # no hint: where the one-launch path stops
    "staged<=64": Variant(lambda: TritonRowMover(max_staged_moves=64), grouped=False),
    "staged<=2048": Variant(
        lambda: TritonRowMover(max_staged_moves=2048, register_words=16384), grouped=False
    ),
}
