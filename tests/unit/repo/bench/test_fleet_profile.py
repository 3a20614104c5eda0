"""bench.fleet.fleet_profile: py-spy's raw stacks summarised by function, line numbers merged."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bench.fleet import fleet_profile

RAW = """\
<module> (ctl.py:1);run (asyncio/base_events.py:10);_reconcile (gpuplane/handlers.py:20);plan (gpuplane/q.py:5) 30
<module> (ctl.py:1);run (asyncio/base_events.py:10);_reconcile (gpuplane/handlers.py:21);decode (json/decoder.py:7) 10
<module> (ctl.py:1);run (asyncio/base_events.py:10);loads (json/decoder.py:9) 60
not a stack line
"""


def test_inclusive_counts_a_function_once_per_sample_and_self_counts_the_leaf() -> None:
    total, inclusive, own = fleet_profile.parse(RAW)
    assert total == 100
    assert inclusive["_reconcile (gpuplane/handlers.py)"] == 40  # two lines of one function merged
    assert inclusive["<module> (ctl.py)"] == 100
    assert own["plan (gpuplane/q.py)"] == 30 and own.get("_reconcile (gpuplane/handlers.py)", 0) == 0
    assert inclusive["decode (json/decoder.py)"] == 10 and inclusive["loads (json/decoder.py)"] == 60


def test_the_event_loop_and_thread_frames_are_not_listed_as_where_time_goes() -> None:
    plumbing = [
        "Thread.run (threading.py)",
        "BaseEventLoop._run_once (asyncio/base_events.py)",
        "_worker (concurrent/futures/thread.py)",
        "run (/usr/lib/python3.11/asyncio/runners.py)",
        "<module> (ctl.py)",
    ]
    assert all(fleet_profile._PLUMBING.search(f) for f in plumbing)
    assert not fleet_profile._PLUMBING.search("make_world (gpuplane/controller/runtime.py)")


@pytest.mark.skipif(fleet_profile._py_spy() is None, reason="py-spy is not installed")
def test_a_live_busy_process_is_profiled_and_its_hot_function_listed() -> None:
    code = "def spin():\n    while True:\n        sum(range(1000))\nspin()\n"
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        text = fleet_profile.summary(fleet_profile.start(proc.pid, 2))
    finally:
        proc.kill()
        proc.wait()
    if "recorded nothing" in text and "ptrace" in text.lower():
        pytest.skip(f"this machine does not allow ptrace: {text}")
    assert "spin (<string>)" in text, text
    busy = int(text.split("busy ")[1].split(" %")[0])
    assert busy >= 50, text
