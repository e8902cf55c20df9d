"""What each rank of ``test_leave_group`` runs under torchrun: join torchrun's group, make a
gloo group as the server does, leave the groups together (rank 1 arriving late), and write to
``out_dir/rank{rank}.json`` when it arrived, when it left, and whether it was still in a group."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch.distributed as dist

from eagletree.app.parallel import process_group

LATE_S = 1.5  # rank 1 reaches the teardown this much after rank 0


def main(out_dir: str) -> None:
    process_group.join_launched_group()
    rank = process_group.group_rank()
    dist.new_group(backend="gloo")
    if rank == 1:
        time.sleep(LATE_S)
    arrived = time.time()
    process_group.leave_group(together=True)
    left = time.time()
    state = {"arrived": arrived, "left": left, "in_group": process_group.in_process_group()}
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(state))


if __name__ == "__main__":
    main(sys.argv[1])
