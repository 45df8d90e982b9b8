"""The event stream every client shares: sequence numbers, a replay buffer, fan-out.

`publish` is synchronous and never waits: it numbers a frame, encodes it once,
keeps it for replay and hands the bytes to each subscriber's bounded queue. A
subscriber that falls too far behind is marked as overflowed and its
connection is closed; it can reconnect and resume by `seq`. So a slow client
never holds up the agent or the other clients.
"""

from __future__ import annotations

import asyncio
import secrets
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any

import msgspec

from .protocol import (
    ServerFrame,
    TextDelta,
    TurnComplete,
    TurnsForgotten,
    TurnStarted,
    encode,
    with_seq,
)

DELTA_INTERVAL = 0.02  # at most one text_delta per turn this often: 50 a second is plenty for any UI
REPLAY_BUFFER = 2000  # broadcast events kept for resume...
REPLAY_BYTES = 32 * 1024 * 1024  # ...within this many bytes, so a few huge messages can't hoard memory
SUBSCRIBER_QUEUE = 1000  # frames a client may have unsent before it is cut loose...
SUBSCRIBER_BYTES = 16 * 1024 * 1024  # ...or bytes: a few huge messages are as heavy as many small ones

# Streamed text is superseded by the assistant_message that follows it, so it is
# not kept for replay: that would push the events that matter out of the buffer.
_TRANSIENT = (TextDelta,)
# What a forgotten turn keeps in the replay buffer: that it started (its words gone) and ended, so
# a client resuming sees the agent's state as it was, then the turns_forgotten that follows puts
# the tombstone there. Its messages, tool calls, recalls and errors are dropped.
_KEPT_WHEN_FORGOTTEN = {TurnStarted.__struct_config__.tag, TurnComplete.__struct_config__.tag}


class Subscriber:
    """One client's outbound queue. Its connection's writer task drains it."""

    def __init__(self, limit: int | None = None, on_overflow: Callable[[], object] | None = None,
                 max_bytes: int | None = None) -> None:
        self._frames: deque[bytes] = deque()
        self._bytes = 0
        self._limit = limit or SUBSCRIBER_QUEUE
        self._max_bytes = max_bytes or SUBSCRIBER_BYTES
        self._on_overflow = on_overflow  # wakes the writer even when it is stuck in a send
        self._ready = asyncio.Event()
        self.drained = asyncio.Event()  # set while nothing queued is unsent (a close waits on it)
        self.drained.set()
        self._taken = asyncio.Event()  # set when the writer takes what is queued
        self.overflowed = False
        self.last_seq = 0  # seq of the last broadcast event queued to this client

    def offer(self, seq: int, data: bytes) -> None:
        if self.overflowed:
            return
        # One frame always fits (a single huge message is not falling behind); a backlog does not.
        if len(self._frames) >= self._limit or (self._frames and self._bytes + len(data) > self._max_bytes):
            self.overflowed = True
            self._frames.clear()
            self._bytes = 0
            self.drained.set()  # nothing more will be sent
            self._taken.set()
            if self._on_overflow is not None:
                self._on_overflow()
        else:
            self._append(data)
            self.last_seq = max(self.last_seq, seq)
        self._ready.set()

    def push_direct(self, data: bytes) -> None:
        """A frame for this client alone (ready, pong, error); not subject to the limit."""
        self._append(data)
        self._ready.set()

    def _append(self, data: bytes) -> None:
        self._frames.append(data)
        self._bytes += len(data)
        self.drained.clear()

    async def next_batch(self) -> list[bytes]:
        """Wait for frames, then take all that are queued. Empty list: overflowed."""
        while not self._frames and not self.overflowed:
            self._ready.clear()
            await self._ready.wait()
        if self.overflowed:
            return []
        batch = list(self._frames)
        self._frames.clear()
        self._bytes = 0
        self._taken.set()
        return batch

    def taken(self) -> Coroutine[Any, Any, object]:
        """What to await for the writer's next take of what is queued (or an overflow); armed now,
        so a take before it is awaited still counts."""
        if not self.overflowed:
            self._taken.clear()
        return self._taken.wait()

    @property
    def queued_bytes(self) -> int:
        """Bytes queued and not yet taken by the writer."""
        return self._bytes

    def batch_sent(self) -> None:
        """The writer sent the batch it took."""
        if not self._frames:
            self.drained.set()

    def __len__(self) -> int:
        return len(self._frames)


class EventHub:
    def __init__(self, buffer: int = REPLAY_BUFFER, max_bytes: int = REPLAY_BYTES) -> None:
        self.stream = secrets.token_hex(6)  # changes at every start: seqs from another run can't resume
        self.seq = 0
        self._buffer: deque[tuple[int, bytes, str | None]] = deque(maxlen=buffer)  # seq, frame, its turn_id
        self._evicted_through = 0  # highest seq dropped from the buffer
        self._bytes = 0
        self._max_bytes = max_bytes
        self._subscribers: set[Subscriber] = set()

    def publish(self, frame: ServerFrame) -> None:
        self.seq += 1
        data = encode(with_seq(frame, self.seq))
        if isinstance(frame, TurnsForgotten):
            self._scrub(set(frame.turn_ids))
        if not isinstance(frame, _TRANSIENT):
            while self._buffer and (len(self._buffer) == self._buffer.maxlen
                                    or self._bytes + len(data) > self._max_bytes):
                seq, old, _turn = self._buffer.popleft()
                self._evicted_through, self._bytes = seq, self._bytes - len(old)
            self._buffer.append((self.seq, data, getattr(frame, "turn_id", None)))
            self._bytes += len(data)
        for sub in self._subscribers:
            sub.offer(self.seq, data)

    def replay_since(self, last_seq: int) -> list[bytes] | None:
        """Events after `last_seq`, or None when some of them are no longer buffered
        (or `last_seq` is from the future: the client saw another run's stream)."""
        if last_seq > self.seq or last_seq < self._evicted_through:
            return None
        return [data for seq, data, _turn in self._buffer if seq > last_seq]

    def _scrub(self, turn_ids: set[str]) -> None:
        """Forgotten turns' words leave the replay buffer too: a client resuming from before the
        forget must not get them back. Seqs stay as they were (a dropped one is simply skipped)."""
        kept: list[tuple[int, bytes, str | None]] = []
        for seq, data, turn in self._buffer:
            if turn in turn_ids:
                fields = msgspec.json.decode(data)
                if fields.get("type") not in _KEPT_WHEN_FORGOTTEN:
                    continue
                if "text" in fields:
                    fields["text"] = ""
                data = msgspec.json.encode(fields)
            kept.append((seq, data, turn))
        self._buffer.clear()
        self._buffer.extend(kept)
        self._bytes = sum(len(data) for _seq, data, _turn in kept)

    def subscribe(self, sub: Subscriber) -> None:
        sub.last_seq = self.seq
        self._subscribers.add(sub)

    def unsubscribe(self, sub: Subscriber) -> None:
        self._subscribers.discard(sub)


class DeltaCoalescer:
    """Publishes frames, merging streamed text into at most one text_delta per turn every
    DELTA_INTERVAL. A fast model streams hundreds of tiny deltas in a burst, and every client
    costs a send per frame; merged, the burst is a handful of frames and the text is the same.
    Any other frame first flushes the pending text, so the order of events is kept."""

    def __init__(self, publish: Callable[[ServerFrame], None], interval: float = DELTA_INTERVAL) -> None:
        self._publish = publish
        self._interval = interval
        self._turn: str | None = None
        self._parts: list[str] = []
        self._timer: asyncio.TimerHandle | None = None

    def __call__(self, frame: ServerFrame) -> None:
        if not isinstance(frame, TextDelta):
            self.flush()
            self._publish(frame)
            return
        if self._turn != frame.turn_id:
            self.flush()
            self._turn = frame.turn_id
        self._parts.append(frame.text)
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._interval, self.flush)

    def flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._parts and self._turn is not None:
            text, self._parts = "".join(self._parts), []
            self._publish(TextDelta(turn_id=self._turn, text=text))
