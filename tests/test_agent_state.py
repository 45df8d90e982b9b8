"""The runtime's rules as pure state machines: no asyncio, no CLI."""

from __future__ import annotations

import pytest

from sprite_os.agent.state import (
    CostMeter,
    EndSession,
    IllegalTransition,
    Inbox,
    SessionPhase,
    SessionState,
    Shutdown,
    Stop,
    Turn,
    TurnCost,
    TurnPhase,
    TurnState,
)


def apply(state: TurnState, step: str) -> None:
    if step.startswith("begin"):
        state.begin(connect=step == "begin-cold")
    else:
        getattr(state, step)()


def turn_at(*steps: str) -> TurnState:
    state = TurnState()
    for step in steps:
        apply(state, step)
    return state


def test_a_turn_on_a_new_cli_starts_connects_sends_and_streams() -> None:
    state = TurnState()
    seen = [state.public]
    state.begin(connect=True)
    seen.append(state.public)
    assert state.connected() is True
    seen.append(state.public)
    assert state.sent() is False
    state.heard()
    state.heard()
    assert state.phase is TurnPhase.STREAMING and [*seen, state.public] == ["idle", "starting", "running", "running"]
    state.end()
    assert state.phase is TurnPhase.IDLE and state.public == "idle"


def test_a_turn_on_a_running_cli_goes_straight_to_sending() -> None:
    state = turn_at("begin-warm")
    assert state.phase is TurnPhase.SENDING and state.public == "running"


@pytest.mark.parametrize(("steps", "stop", "then"), [
    ((), Stop.NOTHING, TurnPhase.IDLE),
    (("begin-cold",), Stop.UNSENT, TurnPhase.CANCELLED),
    (("begin-warm",), Stop.AFTER_SEND, TurnPhase.STOP_AFTER_SEND),
    (("begin-warm", "sent"), Stop.NOW, TurnPhase.STOPPING),
    (("begin-warm", "sent", "heard"), Stop.NOW, TurnPhase.STOPPING),
])
def test_what_an_interrupt_asks_for_depends_on_the_phase(steps: tuple[str, ...], stop: Stop, then: TurnPhase) -> None:
    state = turn_at(*steps)
    assert state.interrupt() is stop
    assert state.phase is then
    if stop is not Stop.NOTHING:
        assert state.interrupted and state.public == "stopping"
        assert state.interrupt() is Stop.ALREADY  # a second press: the turn is stopping, no error
        assert state.phase is then


@pytest.mark.parametrize(("first", "then", "by_server"), [
    (True, False, True),  # the server's stop came first: a person's press after it changes nothing
    (False, True, False),  # the person stopped it: the server's stop then cuts a turn already stopping
    (False, None, False),
])
def test_whoever_stopped_the_turn_first_names_it(first: bool, then: bool | None, by_server: bool) -> None:
    state = turn_at("begin-warm", "sent")
    state.interrupt(by_server=first)
    if then is not None:
        assert state.interrupt(by_server=then) is Stop.ALREADY
    assert state.by_server is by_server
    state.end()
    state.begin(connect=False)
    assert not state.by_server  # the next turn starts unstopped


@pytest.mark.parametrize(("steps", "unsent"), [
    (("begin-cold",), False),
    (("begin-cold", "interrupt"), True),  # before the CLI's start, or once it is up: nothing was sent
    (("begin-warm",), False),
    (("begin-warm", "interrupt"), True),  # asked before the write begins: auto-recall was looking
    (("begin-warm", "sent"), False),
    (("begin-warm", "sent", "interrupt"), False),  # the prompt is out: the CLI is told to stop
])
def test_a_turn_stopped_before_its_prompt_is_written_ends_unsent(steps: tuple[str, ...], unsent: bool) -> None:
    assert turn_at(*steps).stopped_unsent is unsent


def test_interrupted_while_starting_the_turn_ends_unsent() -> None:
    state = turn_at("begin-cold", "interrupt")
    assert state.connected() is False
    assert not state.may_resend


def test_interrupted_while_the_prompt_is_written_the_interrupt_follows_the_prompt() -> None:
    state = turn_at("begin-warm", "interrupt")
    assert state.sent() is True  # now the CLI gets it
    assert state.phase is TurnPhase.STOPPING
    state.heard()  # the rest of the reply is still read
    assert state.phase is TurnPhase.STOPPING


@pytest.mark.parametrize(("steps", "may"), [
    (("begin-warm",), True),  # the write to the CLI failed
    (("begin-warm", "sent"), True),  # sent, and nothing heard
    (("begin-warm", "sent", "heard"), False),  # under way: it may have acted
    (("begin-warm", "interrupt"), False),
    (("begin-warm", "sent", "interrupt"), False),
    (("begin-cold",), False),
])
def test_a_prompt_may_be_resent_only_while_nothing_of_the_turn_happened(steps: tuple[str, ...], may: bool) -> None:
    assert turn_at(*steps).may_resend is may


def test_a_resend_starts_a_fresh_cli_and_an_interrupt_meanwhile_ends_it_unsent() -> None:
    state = turn_at("begin-warm", "sent", "resend")
    assert state.phase is TurnPhase.STARTING and state.public == "starting"
    assert state.interrupt() is Stop.UNSENT and state.connected() is False


@pytest.mark.parametrize(("steps", "step"), [
    ((), "connected"), ((), "sent"), ((), "heard"), ((), "resend"),
    (("begin-cold",), "sent"), (("begin-cold",), "heard"),
    (("begin-warm",), "connected"), (("begin-warm",), "heard"),
    (("begin-warm", "sent", "heard"), "resend"),
    (("begin-warm", "sent"), "begin-warm"),
])
def test_steps_the_rules_do_not_allow_are_bugs(steps: tuple[str, ...], step: str) -> None:
    state = turn_at(*steps)
    with pytest.raises(IllegalTransition):
        apply(state, step)


def test_a_session_is_worth_ending_once_a_turn_ran_in_it() -> None:
    session = SessionState()
    assert session.accepting and not session.worth_ending
    session.turn_ran()
    assert session.worth_ending
    session.began()
    assert session.phase is SessionPhase.FRESH and not session.worth_ending


def test_a_closing_session_refuses_work_to_the_end() -> None:
    session = SessionState()
    session.turn_ran()
    session.close()
    session.began()  # a crash while stopping starts a session; the server is still stopping
    session.turn_ran()
    assert not session.accepting and not session.worth_ending and session.phase is SessionPhase.CLOSING


def test_back_to_back_new_sessions_queue_once() -> None:
    inbox = Inbox()
    first = Turn("hi", None)
    assert inbox.put(EndSession("new_session"))
    assert not inbox.put(EndSession("new_session"))
    assert inbox.put(first) and inbox.put(EndSession("new_session"))
    assert not inbox.put(EndSession("new_session"))
    assert len(inbox) == 3
    assert isinstance(inbox.take(), EndSession) and inbox.take() is first
    assert isinstance(inbox.take(), EndSession) and not inbox
    assert inbox.put(EndSession("new_session"))  # the last one was taken: a new request counts
    inbox.clear()
    assert inbox.put(Shutdown()) and len(inbox) == 1


def test_each_turn_has_its_own_id() -> None:
    assert Turn("a", None).turn_id != Turn("a", None).turn_id


def test_a_turns_cost_is_the_difference_of_the_clis_running_totals() -> None:
    meter = CostMeter()
    meter.new_session()
    meter.new_process()
    # the CLI's totals over three turns of one process: 0.0001, 0.0004, 0.0007
    assert [meter.charge(total) for total in (0.0001, 0.0004, 0.0007)] == [
        TurnCost(0.0001, 0.0001), TurnCost(0.0003, 0.0004), TurnCost(0.0003, 0.0007)]
    assert meter.charge(None) == TurnCost(None, 0.0007)  # no figure: unknown, the session unchanged
    meter.new_session()  # /new: a new session, a new CLI whose total starts from zero
    meter.new_process()
    assert meter.charge(0.0002) == TurnCost(0.0002, 0.0002)


def test_a_process_the_meter_was_not_told_about_counts_from_zero() -> None:
    meter = CostMeter()
    meter.charge(0.005)
    assert meter.charge(0.001) == TurnCost(0.001, 0.006)  # a lower total: a fresh process's first turn
    meter.new_process()  # a resend to a fresh CLI within the session: the session keeps adding
    assert meter.charge(0.002) == TurnCost(0.002, 0.008)


def test_a_forgets_restart_goes_first_and_is_never_merged_with_a_persons_new_session() -> None:
    inbox = Inbox()
    waiting = Turn("hi", None)
    assert inbox.put(waiting) and inbox.put(EndSession("new_session"))
    inbox.put_first(EndSession("forget", "s1"))
    assert inbox.peek() == EndSession("forget", "s1") and len(inbox) == 3
    assert inbox.take() == EndSession("forget", "s1") and inbox.take() is waiting
    assert len(inbox) == 1  # the person's new_session
    inbox.put_first(EndSession("forget", "s2"))
    assert not inbox.put(EndSession("new_session"))  # a person's twice in a row: still one
    inbox.take()
    assert inbox.put(EndSession("forget", "s3"))  # after the person's: not merged into it
    assert [inbox.take() for _ in range(2)] == [EndSession("new_session"), EndSession("forget", "s3")]


def test_the_inbox_names_the_messages_still_waiting_by_their_client_ids_in_order() -> None:
    """What `ready` tells a client whose view starts afresh: its own waiting messages stay in view."""
    inbox = Inbox()
    inbox.put(Turn("first", "web-1"))
    inbox.put(Turn("from the terminal", None))  # sent without an id: nothing to name
    inbox.put(EndSession("new_session"))
    inbox.put(Turn("second", "web-2"))
    assert inbox.waiting() == ["web-1", "web-2"]
    inbox.take()
    assert inbox.waiting() == ["web-2"]
