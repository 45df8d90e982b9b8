"""The shared event stream: numbering, replay, and cutting loose a client that falls behind."""

import json

from devkit.harness import wait_for
from sprite_os import protocol as p
from sprite_os.events import DeltaCoalescer, EventHub, Subscriber


def seqs(frames: list[bytes]) -> list[int]:
    return [json.loads(f)["seq"] for f in frames]


def test_events_are_numbered_and_replayed_after_a_seq() -> None:
    hub = EventHub(buffer=10)
    for n in range(5):
        hub.publish(p.TurnStarted(turn_id=str(n), text="x"))
    assert hub.seq == 5
    assert seqs(hub.replay_since(2) or []) == [3, 4, 5]
    assert hub.replay_since(5) == []


def test_streamed_text_is_not_kept_for_replay_but_still_numbered() -> None:
    hub = EventHub(buffer=10)
    hub.publish(p.TurnStarted(turn_id="t", text="x"))
    hub.publish(p.TextDelta(turn_id="t", text="a"))
    hub.publish(p.AssistantMessage(turn_id="t", text="a"))
    assert seqs(hub.replay_since(0) or []) == [1, 3]


def test_a_forgotten_turns_words_leave_the_replay_buffer() -> None:
    """A client resuming from before a forget gets the turn's start and end, its words gone, then
    the tombstone; another turn's frames are replayed as they were."""
    hub = EventHub(buffer=20)
    for turn in ("gone", "kept"):
        hub.publish(p.TurnStarted(turn_id=turn, text=f"secret {turn}"))
        hub.publish(p.ToolUse(turn_id=turn, tool_use_id="u", name="Read", summary=f"secret {turn} file"))
        hub.publish(p.AssistantMessage(turn_id=turn, text=f"secret {turn} answer"))
        hub.publish(p.TurnComplete(turn_id=turn, status="completed", duration_ms=1, usage=p.Usage()))
    hub.publish(p.TurnsForgotten(session_id="s", turns=[1], turn_ids=["gone"], forgotten_at=1.0))
    replayed = [json.loads(f) for f in hub.replay_since(0) or []]
    assert "secret gone" not in json.dumps(replayed)
    assert [(f["type"], f["seq"]) for f in replayed[:2]] == [("turn_started", 1), ("turn_complete", 4)]
    assert replayed[0]["text"] == "" and replayed[-1]["type"] == "turns_forgotten"
    assert [f["seq"] for f in replayed[2:]] == [5, 6, 7, 8, 9]
    assert "secret kept answer" in json.dumps(replayed)
    assert seqs(hub.replay_since(4) or []) == [5, 6, 7, 8, 9]


def test_a_gap_older_than_the_buffer_cannot_be_replayed() -> None:
    hub = EventHub(buffer=3)
    for n in range(6):
        hub.publish(p.CardClosed(card_id=str(n)))
    assert seqs(hub.replay_since(3) or []) == [4, 5, 6]
    assert hub.replay_since(2) is None  # seq 3 was evicted: the client needs a snapshot
    assert hub.replay_since(99) is None  # from another run of the server


def test_subscribers_get_every_frame_and_a_slow_one_overflows_alone() -> None:
    hub = EventHub()
    fast, slow = Subscriber(limit=100), Subscriber(limit=3)
    hub.subscribe(fast)
    hub.subscribe(slow)
    for n in range(5):
        hub.publish(p.CardClosed(card_id=str(n)))
    assert len(fast) == 5 and fast.last_seq == 5 and not fast.overflowed
    assert slow.overflowed and len(slow) == 0


def test_a_subscriber_overflows_on_bytes_too() -> None:
    woken: list[bool] = []
    sub = Subscriber(limit=100, max_bytes=10, on_overflow=lambda: woken.append(True))
    sub.offer(1, b"12345")
    sub.offer(2, b"12345")
    assert not sub.overflowed
    sub.offer(3, b"x")
    assert sub.overflowed and woken == [True] and len(sub) == 0
    alone = Subscriber(limit=100, max_bytes=10)
    alone.offer(1, b"a frame bigger than the whole budget")
    assert not alone.overflowed and len(alone) == 1


async def test_next_batch_waits_then_drains() -> None:
    sub = Subscriber()
    sub.offer(1, b"a")
    sub.offer(2, b"b")
    assert await sub.next_batch() == [b"a", b"b"]
    sub.offer(3, b"c")
    assert await sub.next_batch() == [b"c"]


async def test_drained_is_set_once_the_writer_sent_what_was_queued() -> None:
    sub = Subscriber()
    assert sub.drained.is_set()  # nothing queued
    sub.offer(1, b"a")
    assert not sub.drained.is_set()
    assert await sub.next_batch() == [b"a"]
    sub.push_direct(b"b")  # queued while the writer sends the first batch
    sub.batch_sent()
    assert not sub.drained.is_set()
    assert await sub.next_batch() == [b"b"]
    assert not sub.drained.is_set()  # taken is not sent
    sub.batch_sent()
    assert sub.drained.is_set()
    overflowing = Subscriber(limit=1)
    overflowing.offer(1, b"x")
    overflowing.offer(2, b"y")
    assert overflowing.overflowed and overflowing.drained.is_set()  # nothing more will be sent
    overflowing = Subscriber(limit=1)
    overflowing.offer(1, b"a")
    overflowing.offer(2, b"b")
    assert await overflowing.next_batch() == []


def test_the_replay_buffer_is_bounded_in_bytes_too() -> None:
    hub = EventHub(buffer=100, max_bytes=1000)
    for n in range(5):
        hub.publish(p.AssistantMessage(turn_id=str(n), text="x" * 300))
    kept = hub.replay_since(hub._evicted_through) or []
    assert sum(len(f) for f in kept) <= 1000 and len(kept) < 5
    assert hub.replay_since(0) is None  # the oldest were evicted to stay in budget


async def test_streamed_text_is_coalesced_and_order_is_kept() -> None:
    out: list[p.ServerFrame] = []
    publish = DeltaCoalescer(out.append, interval=0.05)
    for word in ("a ", "b ", "c "):
        publish(p.TextDelta(turn_id="t", text=word))
    assert out == []  # merged, waiting for the interval
    await wait_for(lambda: out == [p.TextDelta(turn_id="t", text="a b c ")], timeout=2, interval=0.01)
    publish(p.TextDelta(turn_id="t", text="d"))
    publish(p.AssistantMessage(turn_id="t", text="a b c d"))  # flushes the pending text first
    publish(p.TextDelta(turn_id="u", text="x"))
    publish(p.TextDelta(turn_id="v", text="y"))  # another turn: the first one's text goes out first
    publish.flush()
    assert out[1:] == [p.TextDelta(turn_id="t", text="d"), p.AssistantMessage(turn_id="t", text="a b c d"),
                       p.TextDelta(turn_id="u", text="x"), p.TextDelta(turn_id="v", text="y")]
