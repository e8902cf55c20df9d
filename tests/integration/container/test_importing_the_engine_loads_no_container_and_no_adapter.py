"""The engine loop stays free of the composition root: importing it, in a fresh
interpreter, loads no container, no adapter and no dependency_injector."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_engine_loads_no_container_and_no_adapter() -> None:
    code = (
        "import sys, eagletree.app.engine.loop\n"
        "names = ('eagletree.adapters', 'eagletree.app.composition', 'dependency_injector')\n"
        "print(sorted(m for m in sys.modules if m.startswith(names)))\n"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert loaded.strip() == "[]"
