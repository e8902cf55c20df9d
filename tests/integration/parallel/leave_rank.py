"""What each rank of ``test_leave_group`` runs under torchrun: join torchrun's group, make a
gloo group as the server does, held in a reference cycle as an engine holds its groups, leave
the groups together (rank 1 arriving late), and write to ``out_dir/rank{rank}.json`` when it
arrived, when it left, whether it was still in a group and whether the cycle was freed."""

from __future__ import annotations

import gc
import json
import sys
import time
from pathlib import Path

import torch.distributed as dist

from eagletree.app.parallel import process_group

LATE_S = 1.5  # rank 1 reaches the teardown this much after rank 0


class GroupHolder:
    """Holds a group in a reference cycle (with itself), as an engine's objects do; notes when
    the collector frees it."""

    freed = False

    def __init__(self, group: object) -> None:
        self.group = group
        self.me = self

    def __del__(self) -> None:
        GroupHolder.freed = True


def main(out_dir: str) -> None:
    process_group.join_launched_group()
    rank = process_group.group_rank()
    gc.disable()  # only leave_group's own collection may free the cycle
    GroupHolder(dist.new_group(backend="gloo"))
    if rank == 1:
        time.sleep(LATE_S)
    arrived = time.time()
    process_group.leave_group(together=True)
    left = time.time()
    state = {
        "arrived": arrived,
        "left": left,
        "in_group": process_group.in_process_group(),
        "cycle_freed": GroupHolder.freed,
    }
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(state))


if __name__ == "__main__":
    main(sys.argv[1])
