"""The daemon's retry and failure policy, without asyncio: time and randomness are passed in."""

import pytest

from sprite_os.memory.curation.retry import (
    BACKOFF_MAX,
    CURATOR_BACKOFF,
    FAILING_GAP,
    STALE_AFTER,
    STALE_MIN_FAILURES,
    UNUSABLE_LIMIT,
    FailureClock,
    PoisonTurns,
    Probe,
    Verdict,
)

T0 = 1_790_000_000.0
HOUR = 3600.0

# ---------------------------------------------------------------- Backoff


def test_backoff_doubles_from_two_seconds_to_five_minutes() -> None:
    middle = [CURATOR_BACKOFF.delay(n, 0.5) for n in range(1, 12)]  # rand 0.5: the jitter's centre
    # Near the top the jitter is cut at the maximum, so its centre moves down.
    assert middle == pytest.approx([2, 4, 8, 16, 32, 64, 128, (0.8 * 256 + 300) / 2] + [(0.8 * 300 + 300) / 2] * 3)
    assert CURATOR_BACKOFF.delay(10_000, 0.5) == pytest.approx(270)  # no overflow after days of failing


@pytest.mark.parametrize("failures", [1, 5, 8, 9, 10, 50])
def test_jitter_spreads_retries_and_never_announces_one_beyond_the_maximum(failures: int) -> None:
    backoff = CURATOR_BACKOFF
    low, high = backoff.delay(failures, 0.0), backoff.delay(failures, 0.999999)
    assert high <= BACKOFF_MAX
    assert high - low > 0.1 * min(high, BACKOFF_MAX)  # spread, even at the top
    base = min(BACKOFF_MAX, 2.0 * 2 ** (failures - 1))
    assert low == pytest.approx(0.8 * base)


def test_the_longest_wait_between_failed_calls_is_shorter_than_the_failing_gap() -> None:
    call_timeout = 120.0  # processor.CALL_TIMEOUT
    assert max(CURATOR_BACKOFF.delay(n, 0.999999) for n in range(1, 30)) + call_timeout < FAILING_GAP

# ---------------------------------------------------------------- FailureClock


def fail_every(clock: FailureClock, start: float, step: float, n: int) -> float:
    """`n` failed calls `step` seconds apart from `start`; returns the time of the last one."""
    for k in range(n):
        clock.failed(start + k * step)
    return start + (n - 1) * step


def test_the_clock_counts_a_spell_from_its_first_failed_call() -> None:
    clock = FailureClock()
    assert clock.failed(T0) is False
    clock.next_retry_at = T0 + 2
    fail_every(clock, T0 + 2, 2, 3)
    assert (clock.since, clock.failures, clock.last) == (T0, 4, T0 + 6)
    assert clock.report() == {"consecutive_failures": 4, "failing_since": T0, "next_retry_at": T0 + 2,
                              "degraded": True}
    assert clock.succeeded() is True
    assert (clock.since, clock.failures, clock.last, clock.next_retry_at) == (None, 0, None, None)
    assert clock.succeeded() is False  # nothing to clear in memory.db
    assert clock.report()["degraded"] is False


def test_degraded_after_three_failed_calls() -> None:
    clock = FailureClock()
    assert [(clock.failed(T0 + n), clock.report()["degraded"])[1] for n in range(4)] == [False, False, True, True]


def test_stale_needs_six_hours_and_five_failed_calls() -> None:
    clock = FailureClock()
    last = fail_every(clock, T0, 300, 72)  # a call every five minutes: 5 h 55 min
    assert clock.failures == 72 and clock.stale_cutoff(last) is None
    clock.failed(T0 + STALE_AFTER)
    assert clock.stale_cutoff(T0 + STALE_AFTER) == T0  # turns recorded more than six hours ago


def test_six_hours_with_fewer_than_five_failed_calls_is_not_stale() -> None:
    # A restart every few minutes for six hours would not do this; only the count can tell a
    # spell from a Sprite that was stopped and counted nothing.
    clock = FailureClock(gap=10 * HOUR)
    fail_every(clock, T0, 2 * HOUR, STALE_MIN_FAILURES - 1)
    assert clock.stale_cutoff(T0 + 7 * HOUR) is None
    clock.failed(T0 + 7 * HOUR)
    assert clock.stale_cutoff(T0 + 7 * HOUR) == T0 + HOUR


def test_a_gap_longer_than_twice_the_longest_backoff_is_a_sleep_and_restarts_the_clock() -> None:
    clock = FailureClock()
    last = fail_every(clock, T0, 60, 5)
    assert clock.failed(last + FAILING_GAP) is False  # just within: still the same spell
    assert (clock.since, clock.failures) == (T0, 6)
    woke = last + FAILING_GAP + 8 * HOUR  # an eight-hour suspend
    assert clock.failed(woke) is True
    assert (clock.since, clock.failures, clock.last) == (woke, 1, woke)
    assert clock.stale_cutoff(woke) is None


def test_the_spell_survives_a_restart_through_its_saved_record() -> None:
    clock = FailureClock()
    fail_every(clock, T0, 10, 3)
    clock.next_retry_at = T0 + 30
    saved = clock.dumps()
    restored = FailureClock()
    restored.restore(saved)
    assert restored.report() == clock.report()
    assert (restored.since, restored.failures, restored.last) == (T0, 3, T0 + 20)
    clock.succeeded()
    assert clock.dumps() == ""
    restored.restore("")
    assert restored.report()["consecutive_failures"] == 0


def test_a_record_saved_without_its_last_call_counts_as_a_gap() -> None:
    clock = FailureClock()
    clock.restore('{"since": %r, "failures": 9}' % (T0 - 7 * HOUR))  # an older version's value
    assert (clock.failures, clock.last, clock.next_retry_at) == (9, None, None)
    assert clock.failed(T0) is True and (clock.since, clock.failures) == (T0, 1)


@pytest.mark.parametrize("raw", ["not json", "[]", '{"since": "yesterday", "failures": 2}', '{"failures": 2}'])
def test_an_unreadable_record_is_an_error_and_leaves_a_fresh_clock(raw: str) -> None:
    clock = FailureClock()
    fail_every(clock, T0, 1, 4)
    with pytest.raises(ValueError, match="unreadable"):
        clock.restore(raw)
    assert (clock.since, clock.failures) == (None, 0)

# ---------------------------------------------------------------- PoisonTurns


def replies(isolation: PoisonTurns, pending: list[int], refused: set[int], calls: int) -> list[str]:
    """Play `calls` calls against a model that refuses any call showing a turn in `refused` and
    succeeds otherwise (the successful turns leave `pending`). Returns what each call carried and
    the verdict: "1-6 retry", "5 stale", "2 ok"."""
    log = []
    for _ in range(calls):
        if not pending:
            break
        one = isolation.next_turn(pending)
        ids = [one] if one is not None else list(pending)
        label = f"{ids[0]}-{ids[-1]}" if len(ids) > 1 else str(ids[0])
        if refused & set(ids):
            verdict = isolation.unusable(ids)
            log.append(f"{label} {verdict.value}")
            if verdict is Verdict.STALE:
                pending.remove(ids[0])
        else:
            isolation.succeeded()
            log.append(f"{label} ok")
            pending[:] = [i for i in pending if i not in ids]
    return log


def test_a_poison_turn_is_run_alone_and_marked_stale_once_another_turn_succeeded_alone() -> None:
    pending = [2, 3, 4, 5, 6, 7]
    assert replies(PoisonTurns(), pending, {5}, 20) == [
        "2-7 retry", "2-7 retry", "2-7 isolate", "2 ok", "3 ok", "4 ok",
        "5 retry", "5 retry", "5 stale", "6-7 ok"]  # found: the rest in one call again
    assert pending == []


def test_a_second_poison_turn_in_the_rest_starts_a_new_isolation() -> None:
    assert replies(PoisonTurns(), [1, 2, 3, 4, 5], {2, 4}, 30) == [
        "1-5 retry", "1-5 retry", "1-5 isolate", "1 ok", "2 retry", "2 retry", "2 stale",
        "3-5 retry", "3-5 retry", "3-5 isolate", "3 ok", "4 retry", "4 retry", "4 stale", "5 ok"]


def test_the_oldest_turn_as_poison_is_set_aside_until_another_turn_shows_the_model_works() -> None:
    pending = [1, 2, 3]
    isolation = PoisonTurns()
    assert replies(isolation, pending, {1}, 20) == [
        "1-3 retry", "1-3 retry", "1-3 isolate", "1 set-aside", "2 ok",
        "1 retry", "1 retry", "1 stale", "3 ok"]  # the turn set aside goes first once 2 succeeded


def test_a_model_that_answers_everything_with_garbage_never_gets_a_turn_marked_stale() -> None:
    pending = [2, 3, 4, 5, 6, 7]
    isolation = PoisonTurns()
    log = replies(isolation, pending, set(pending), 40)
    assert log[:3] == ["2-7 retry", "2-7 retry", "2-7 isolate"]
    assert log[3:9] == [f"{n} set-aside" for n in range(2, 7)] + ["7 give-up"]  # each turn once
    assert set(log[9:]) == {"2-7 retry"}  # then plain failures: whole chunks, no new isolation
    assert pending == [2, 3, 4, 5, 6, 7] and isolation.probed == 6 and isolation.queue == []
    assert "2-8 isolate" in replies(isolation, [*pending, 8], set(pending), UNUSABLE_LIMIT)  # newer turns joined
    isolation.succeeded()
    assert isolation.probed == 0  # and a success allows a new isolation of any chunk


def test_a_lone_turn_can_not_be_told_apart_from_a_broken_model() -> None:
    isolation = PoisonTurns()
    assert set(replies(isolation, [1], {1}, 3 * UNUSABLE_LIMIT)) == {"1 retry"}
    assert isolation.probed == 0  # not a failed isolation: newer turns isolate it at once
    assert replies(isolation, [1, 2, 3], {1}, 20)[UNUSABLE_LIMIT - 1:] == [
        "1-3 isolate", "1 set-aside", "2 ok", "1 retry", "1 retry", "1 stale", "3 ok"]


def test_two_poison_turns_wait_for_newer_turns_then_are_both_isolated() -> None:
    isolation = PoisonTurns()
    assert replies(isolation, [1, 2], {1, 2}, UNUSABLE_LIMIT + 2)[-3:] == [
        "1-2 isolate", "1 set-aside", "2 give-up"]
    assert isolation.probed == 2
    assert replies(isolation, [1, 2], {1, 2}, UNUSABLE_LIMIT) == ["1-2 retry"] * UNUSABLE_LIMIT
    pending = [1, 2, 3, 4]
    assert replies(isolation, pending, {1, 2}, 30) == [
        "1-4 retry", "1-4 retry", "1-4 isolate", "1 set-aside", "2 set-aside", "3 ok",
        "1 retry", "1 retry", "1 stale", "2 retry", "2 retry", "2 stale", "4 ok"]


def test_turns_that_left_pending_otherwise_leave_the_isolation() -> None:
    isolation = PoisonTurns()
    for _ in range(UNUSABLE_LIMIT):
        verdict = isolation.unusable([1, 2, 3])
    assert verdict is Verdict.ISOLATE and isolation.next_turn([1, 2, 3]) == 1
    assert isolation.next_turn([3, 4]) == 3  # 1 and 2 were marked stale by the six-hour rule
    assert isolation.next_turn([4]) is None and isolation.evidence is False  # over: whole chunks again


def test_unusable_replies_count_in_a_row_for_one_chunk() -> None:
    isolation = PoisonTurns()
    assert [isolation.unusable([1, 2]) for _ in range(UNUSABLE_LIMIT - 1)] == [Verdict.RETRY] * (UNUSABLE_LIMIT - 1)
    assert isolation.unusable([7, 8]) is Verdict.RETRY  # another chunk (1 and 2 went stale meanwhile)
    assert isolation.unusable([1, 2]) is Verdict.RETRY  # not in a row any more: counted from one again
    isolation.succeeded()
    assert [isolation.unusable([1, 2]) for _ in range(UNUSABLE_LIMIT)][-1] is Verdict.ISOLATE


def test_a_probe_asks_now_and_then_sooner_once_a_batch_is_asked_for_and_never_past_the_retry() -> None:
    probe = Probe(every=15.0, soonest=5.0)
    probe.waiting(100.0)  # a call failed for the proxy at 100
    assert probe.due(100.0, retry_at=400.0) == 115.0
    probe.asked = True  # a new turn asks for a batch
    assert probe.due(101.0, retry_at=400.0) == 105.0
    assert probe.due(109.0, retry_at=400.0) == 109.0  # overdue: now
    probe.probed(109.0)  # no answer
    assert probe.due(110.0, retry_at=400.0) == 124.0
    assert probe.due(110.0, retry_at=120.0) is None  # the retry itself comes first
