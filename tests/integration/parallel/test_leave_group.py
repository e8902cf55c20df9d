"""``process_group.leave_group(together=True)`` under torchrun: no rank tears its groups down
before every rank has reached the teardown, and afterwards none is left in a group and the
objects that held one are freed (a rank that exits with its gloo groups alive, or tears them
down under a peer still using them, can abort at exit)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from eagletree.app.parallel.process_group import free_port
from tests.integration.parallel.leave_rank import LATE_S

ROOT = Path(__file__).resolve().parents[3]


def test_ranks_leave_their_groups_together_and_are_in_none_after(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    command += ["--master-addr", "127.0.0.1", "--master-port", str(free_port())]
    command += [str(ROOT / "tests/integration/parallel/leave_rank.py"), str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    first, late = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert late["arrived"] - first["arrived"] >= LATE_S * 0.9, (first, late)
    assert first["left"] >= late["arrived"], (first, late)  # rank 0 waited for rank 1
    assert not first["in_group"] and not late["in_group"]
    # the objects holding a group are freed while the interpreter still runs
    assert first["cycle_freed"] and late["cycle_freed"]
