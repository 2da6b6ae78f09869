"""The supervisor restarts a service that exits, with a doubling backoff, and leaves a running
one alone (real, tiny processes; time passed explicitly)."""

from __future__ import annotations

import sys

from splitspec.launcher.service import Service
from splitspec.launcher.supervisor import INITIAL_BACKOFF_S, MAX_BACKOFF_S, Supervisor


def test_an_exited_service_is_restarted_with_backoff_and_a_running_one_is_left_alone(tmp_path):
    crashing = Service("crashing", [sys.executable, "-c", "raise SystemExit(3)"], 0)
    steady = Service("steady", [sys.executable, "-c", "import time; time.sleep(60)"], 0)
    lines: list[str] = []
    sup = Supervisor([crashing, steady], dict, lines.append)
    try:
        for svc in (crashing, steady):
            svc.start({})
        crashing.proc.wait(30)
        now, backoff, restarts = 0.0, INITIAL_BACKOFF_S, 0
        for _ in range(6):
            sup.poll(now)  # notices the exit: restart scheduled after the backoff
            assert "crashing exited with code 3" in lines[-1]
            sup.poll(now + backoff / 2)
            assert sup.restarts("crashing") == restarts  # not before its time
            sup.poll(now + backoff)
            restarts += 1
            assert sup.restarts("crashing") == restarts
            crashing.proc.wait(30)
            now, backoff = now + backoff, min(MAX_BACKOFF_S, backoff * 2)
        assert backoff == MAX_BACKOFF_S
        assert sup.restarts("steady") == 0 and steady.alive()
    finally:
        steady.stop()
        crashing.stop()
