"""The process group behind ``jetfleet up`` and the local connector: what a component started and
did not stop goes when the component is stopped or exits (real processes)."""

from __future__ import annotations

import sys
from pathlib import Path

from base.process import ProcessGroup, Restarter
from tests.support.wait import wait_for

# a component that starts a grandchild (as a vLLM worker starts EngineCore), says its pid, and
# ignores SIGTERM's usual end for the grandchild: it exits alone and leaves the grandchild behind
_PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(child.pid, flush=True)
if sys.argv[1] == "exit":
    sys.exit(3)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def _grandchild(log: Path) -> int:
    text: str = await wait_for(lambda: log.is_file() and log.read_text().strip(), 10.0)
    return int(text.split()[0])


async def test_stopping_a_component_takes_what_it_started(tmp_path: Path) -> None:
    group = ProcessGroup(tmp_path)
    child = group.start("worker-0", [sys.executable, "-c", _PARENT, "run"])
    grandchild = await _grandchild(child.log_path)
    assert _alive(grandchild)
    group.stop("worker-0", timeout_s=5.0)  # SIGTERM ends the component, not its grandchild
    await wait_for(lambda: not _alive(grandchild), 5.0)


async def test_a_component_that_exits_leaves_nothing_running(tmp_path: Path) -> None:
    group = ProcessGroup(tmp_path)
    child = group.start("worker-0", [sys.executable, "-c", _PARENT, "exit"])
    grandchild = await _grandchild(child.log_path)
    await wait_for(lambda: child.proc.poll() is not None, 10.0)
    exited = Restarter(group).poll()  # what up's supervisor loop calls
    assert [c.name for c, _wait in exited] == ["worker-0"]
    await wait_for(lambda: not _alive(grandchild), 5.0)
