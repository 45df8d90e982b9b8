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
from collections.abc import Callable, Iterable

from .protocol import ServerFrame, TextDelta, encode, with_seq

REPLAY_BUFFER = 2000  # broadcast events kept for resume...
REPLAY_BYTES = 32 * 1024 * 1024  # ...within this many bytes, so a few huge messages can't hoard memory
SUBSCRIBER_QUEUE = 1000  # frames a client may have unsent before it is cut loose

# Streamed text is superseded by the assistant_message that follows it, so it is
# not kept for replay: that would push the events that matter out of the buffer.
_TRANSIENT = (TextDelta,)


class Subscriber:
    """One client's outbound queue. Its connection's writer task drains it."""

    def __init__(self, limit: int | None = None, on_overflow: Callable[[], object] | None = None) -> None:
        self._frames: deque[bytes] = deque()
        self._limit = limit or SUBSCRIBER_QUEUE
        self._on_overflow = on_overflow  # wakes the writer even when it is stuck in a send
        self._ready = asyncio.Event()
        self.overflowed = False
        self.last_seq = 0  # seq of the last broadcast event queued to this client

    def offer(self, seq: int, data: bytes) -> None:
        if self.overflowed:
            return
        if len(self._frames) >= self._limit:
            self.overflowed = True
            self._frames.clear()
            if self._on_overflow is not None:
                self._on_overflow()
        else:
            self._frames.append(data)
            self.last_seq = max(self.last_seq, seq)
        self._ready.set()

    def push_direct(self, data: bytes) -> None:
        """A frame for this client alone (ready, pong, error); not subject to the limit."""
        self._frames.append(data)
        self._ready.set()

    async def next_batch(self) -> list[bytes]:
        """Wait for frames, then take all that are queued. Empty list: overflowed."""
        while not self._frames and not self.overflowed:
            self._ready.clear()
            await self._ready.wait()
        if self.overflowed:
            return []
        batch = list(self._frames)
        self._frames.clear()
        return batch

    def __len__(self) -> int:
        return len(self._frames)


class EventHub:
    def __init__(self, buffer: int = REPLAY_BUFFER, max_bytes: int = REPLAY_BYTES) -> None:
        self.stream = secrets.token_hex(6)  # changes at every start: seqs from another run can't resume
        self.seq = 0
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer)
        self._evicted_through = 0  # highest seq dropped from the buffer
        self._bytes = 0
        self._max_bytes = max_bytes
        self._subscribers: set[Subscriber] = set()

    def publish(self, frame: ServerFrame) -> None:
        self.seq += 1
        data = encode(with_seq(frame, self.seq))
        if not isinstance(frame, _TRANSIENT):
            while self._buffer and (len(self._buffer) == self._buffer.maxlen
                                    or self._bytes + len(data) > self._max_bytes):
                seq, old = self._buffer.popleft()
                self._evicted_through, self._bytes = seq, self._bytes - len(old)
            self._buffer.append((self.seq, data))
            self._bytes += len(data)
        for sub in self._subscribers:
            sub.offer(self.seq, data)

    def replay_since(self, last_seq: int) -> list[bytes] | None:
        """Events after `last_seq`, or None when some of them are no longer buffered
        (or `last_seq` is from the future: the client saw another run's stream)."""
        if last_seq > self.seq or last_seq < self._evicted_through:
            return None
        return [data for seq, data in self._buffer if seq > last_seq]

    def subscribe(self, sub: Subscriber) -> None:
        sub.last_seq = self.seq
        self._subscribers.add(sub)

    def unsubscribe(self, sub: Subscriber) -> None:
        self._subscribers.discard(sub)

    @property
    def subscribers(self) -> Iterable[Subscriber]:
        return tuple(self._subscribers)
