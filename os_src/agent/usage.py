"""What a Messages API reply says it used, read from its bytes as they pass through the relay.

A streamed reply (SSE) reports its input in `message_start` and its output in `message_delta`
(the total so far, last one at the end); a JSON reply in its `usage`. The meter reads those and
nothing else: events are split at blank lines, and only the two that carry usage are decoded. An
event too large to be one of them is skipped without being held. Pure, fed chunk by chunk.
"""

from __future__ import annotations

import math
from typing import TypeVar

import msgspec

from ..spending import cost_usd
from ..text import CHARS_PER_TOKEN

T = TypeVar("T")

MAX_USAGE_EVENT = 64 * 1024  # message_start/message_delta are small; a larger event is content, skipped
MAX_JSON_REPLY = 4 * 1024 * 1024  # a JSON reply held to read its usage, at most (then the estimate stands)


class Usage(msgspec.Struct):
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_creation_input_tokens: int | None = None
    cache_read_input_tokens: int | None = None


class _Message(msgspec.Struct):
    usage: Usage | None = None


class _Event(msgspec.Struct):
    type: str = ""
    message: _Message | None = None  # message_start
    usage: Usage | None = None  # message_delta


class UsageMeter:
    """Feed it a reply's body; `cost(model)` is what the reply used, or the most it can have used."""

    def __init__(self, stream: bool) -> None:
        self._stream = stream
        self._buffer = bytearray()
        self._skipping = False  # inside an event too large to carry usage: drop until its end
        self._seen: dict[str, int] = {}
        self.bytes = 0  # of the reply, all of it
        self.complete = False  # the final usage was read (message_delta, or the JSON reply's)

    def feed(self, chunk: bytes) -> None:
        self.bytes += len(chunk)
        if not self._stream:
            if len(self._buffer) + len(chunk) <= MAX_JSON_REPLY:
                self._buffer += chunk
            return
        self._buffer += chunk
        while True:
            end = _event_end(self._buffer)
            if end is None:
                if len(self._buffer) > MAX_USAGE_EVENT:
                    self._skipping = True
                    del self._buffer[:-3]  # keep what may begin the blank line that ends it
                return
            event, skipped = bytes(self._buffer[:end]), self._skipping
            del self._buffer[:end]
            self._skipping = False
            if not skipped:
                self._event(event)

    def finish(self) -> None:
        """The reply has ended (a JSON reply is read only now)."""
        if not self._stream and self._buffer:
            self._take(_decode(bytes(self._buffer), _Message))
        self._buffer.clear()

    def _event(self, raw: bytes) -> None:
        data = b"".join(line[5:].strip() for line in raw.splitlines() if line.startswith(b"data:"))
        if b'"message_start"' not in data and b'"message_delta"' not in data:
            return
        event = _decode(data, _Event)
        if event is None:
            return
        if event.type == "message_start" and event.message is not None:
            self._take(event.message, final=False)
        elif event.type == "message_delta" and event.usage is not None:
            self._take(_Message(event.usage))

    def _take(self, message: _Message | None, *, final: bool = True) -> None:
        if message is None or message.usage is None:
            return
        for name in Usage.__struct_fields__:
            value = getattr(message.usage, name)
            if isinstance(value, int) and value >= 0:
                self._seen[name] = value
        self.complete = self.complete or final

    def usage(self) -> dict[str, int]:
        return dict(self._seen)

    def cost(self, model: str, worst_case: float) -> float:
        """What the reply cost: its reported usage, priced. A reply cut short (an interrupt, a
        proxy that failed) reported its input but not its output: that is counted from the bytes
        that came, at the rule of thumb (their framing makes it an overcount). With no usage at
        all, the worst case the call was allowed on."""
        seen = self._seen
        if not seen:
            return worst_case
        output = seen.get("output_tokens", 0)
        if not self.complete:
            output = max(output, math.ceil(self.bytes / CHARS_PER_TOKEN))
        return cost_usd(model, seen.get("input_tokens", 0), output, seen.get("cache_creation_input_tokens", 0),
                        seen.get("cache_read_input_tokens", 0))


def _event_end(buffer: bytearray) -> int | None:
    """Where the first event in `buffer` ends (after its blank line), or None."""
    ends = [i + len(sep) for sep in (b"\n\n", b"\r\n\r\n") if (i := buffer.find(sep)) >= 0]
    return min(ends) if ends else None


def _decode(data: bytes, kind: type[T]) -> T | None:
    try:
        return msgspec.json.decode(data, type=kind)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return None
