"""A stop's one deadline (stopping.py): the steps' shares add up to less than the service's timeout,
and memory's flush gets its share whatever the steps before it take. Pure: `now` is given."""

from __future__ import annotations

import pytest

from sprite_os.commands import service
from sprite_os.stopping import (
    CAPTURE,
    CLI_END,
    CLIENTS,
    DECISION,
    EXIT,
    FLUSH,
    MEMORY_RESERVE,
    STOP_TIMEOUT,
    TURN_GRACE,
    StopDeadline,
)


def _worst(d: StopDeadline) -> dict[str, float]:
    """Every step takes all it may (the flush: up to its cut), in the order server.py and memory's stop
    take them; what each had, and when the last ended. (The capture's cut, past its landing, is for a
    journal's sync that hangs: test_the_capture_keeps_half_the_flushs_share_when_its_sync_hangs.)"""
    now, had = d.start, {}
    for step in ("turn", "cli", "connections", "files", "listener", "decision", "capture", "imports",
                 "flush", "stores"):
        if step in ("capture", "flush"):
            soft, cut = getattr(d, step)(now)
            had[step] = soft
            now += cut if step == "flush" else soft
        elif step == "decision":
            had[step] = d.decision(now)
            now += d.before_memory(now)  # where it is cut
        else:
            had[step] = {"turn": d.turn, "cli": d.cli, "stores": d.stores}.get(step, d.before_memory)(now)
            now += had[step]
    had["ended"] = now
    return had


@pytest.mark.parametrize("timeout", [STOP_TIMEOUT, 12.0])
def test_every_step_taking_all_it_may_still_ends_before_the_kill_with_memorys_flush_whole(timeout: float) -> None:
    d = StopDeadline(start=100.0, timeout=timeout)
    had = _worst(d)
    assert had["ended"] <= d.exit_at() < d.end  # and the guard ends a process still alive before SIGKILL
    assert had["capture"] == pytest.approx(d.seconds(CAPTURE))
    assert had["flush"] == pytest.approx(d.seconds(FLUSH))
    assert had["turn"] == pytest.approx(d.seconds(TURN_GRACE))
    assert had["cli"] == pytest.approx(d.seconds(CLI_END))
    assert had["connections"] == pytest.approx(d.seconds(CLIENTS))
    assert had["decision"] == 0  # the worst case leaves it nothing: its job is on disk, decided at the next start


def test_the_service_kills_at_the_deadlines_timeout() -> None:
    assert service.STOP_TIMEOUT == STOP_TIMEOUT


def test_the_figures_add_up_within_the_timeout() -> None:
    assert TURN_GRACE + CLI_END + CLIENTS + MEMORY_RESERVE <= STOP_TIMEOUT


@pytest.mark.parametrize("hung_until", [0.0, 5.0, 39.0, 45.0, 59.0, 80.0])
def test_a_step_before_memory_that_hangs_is_cut_before_memorys_reserve(hung_until: float) -> None:
    """Wherever the steps before it stand, memory begins by the end less its reserve (or at once)."""
    d = StopDeadline(start=0.0)
    now = min(hung_until, d.end)
    assert now + d.before_memory(now) <= max(now, d.end - MEMORY_RESERVE)
    assert d.before_memory(now) >= 0


def test_a_quick_stop_gives_a_forgets_decision_its_whole_share() -> None:
    d = StopDeadline(start=0.0)
    assert d.decision(2.0) == DECISION  # the turn ended at once, no request in flight
    assert d.before_memory(2.0) > DECISION  # and it is cut (if it overruns) only where memory's reserve begins


def test_the_capture_keeps_half_the_flushs_share_when_its_sync_hangs() -> None:
    d = StopDeadline(start=0.0)
    landing, cut = d.capture(d.end - MEMORY_RESERVE)
    assert landing == CAPTURE and cut == CAPTURE + FLUSH / 2
    flushing, _ = d.flush(d.end - MEMORY_RESERVE + cut)  # the journal's sync took all it may
    assert flushing == FLUSH / 2
    assert d.stores(d.end) == 0 and d.budget(d.end + 10, 5.0) == 0  # never below nothing


def test_a_shorter_timeout_scales_every_share() -> None:
    d = StopDeadline(start=0.0, timeout=STOP_TIMEOUT / 5)
    assert d.turn(0.0) == TURN_GRACE / 5
    assert d.exit_at() == pytest.approx(d.end - EXIT / 10)
