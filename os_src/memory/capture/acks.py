"""Durable, then acknowledged: when a closed turn is on disk, for the runtime to tell the person.

A person who reads `turn_complete` must be able to pull the plug and find the turn there. So
the runtime waits, before it publishes it, until the turn's observation is durable by either
of two ways, whichever comes first:

- transcript.db: the commit is synced (synchronous=FULL), or the writer's spill file holds it
  (fsync'd);
- the turn journal: a save that holds the closed turn is fsync'd.

Each way can also fail: transcript.db refused the write and the spill file could not take it
either (a full disk, a read-only file system), or a save of the journal failed (or none is
made: the journal is stuck, told at the turn's close). When both have
failed for a turn, it is not durable and can't be yet: the runtime is told at once (False)
rather than waiting, and says so beside `turn_complete`; the turn stays queued in memory and
lands when the disk allows. A way that is only slow (a lock, a busy thread) is waited for.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, field

Key = tuple[str, int | str]  # a turn's (session_id, sequence_num), a command's write key (spill.write_key)


@dataclass
class _Ack:
    done: asyncio.Future[bool]
    failed: set[str] = field(default_factory=set)  # the ways that failed: "transcript", "journal"
    ways: int = 2  # how many ways it has: a command that left no turn has no journal entry, only transcript.db


class Acks:
    """The closed turns not yet durable, and the futures the runtime awaits for them."""

    def __init__(self) -> None:
        self._waiting: dict[Key, _Ack] = {}
        self.unsaved: set[Key] = set()  # turns the person was told are not saved, until they are durable
        self.unsaved_total = 0

    def not_saved(self, key: Key) -> None:
        """The runtime told the person this turn is not saved (it was not durable in time)."""
        if key in self._waiting and key not in self.unsaved:
            self.unsaved.add(key)
            self.unsaved_total += 1

    def expect(self, key: Key, ways: int = 2) -> asyncio.Future[bool]:
        """A turn just closed as `key`: the future is True once it is durable, False once it can't
        be for now (by any of its `ways`). Call it before the turn's writes are handed out."""
        ack = self._waiting.get(key)
        if ack is None:
            ack = self._waiting[key] = _Ack(asyncio.get_running_loop().create_future(), ways=ways)
        return ack.done

    def durable(self, key: Key) -> None:
        self.unsaved.discard(key)
        if (ack := self._waiting.pop(key, None)) is not None and not ack.done.done():
            ack.done.set_result(True)

    def transcript_failed(self, keys: Iterable[Key]) -> None:
        """transcript.db refused these turns, and the spill file could not take them either."""
        self._failed(keys, "transcript")

    def journal_saved(self, keys: Iterable[Key], error: BaseException | None) -> None:
        """A save of the journal holding these closed turns ended: on disk (None), or failed."""
        if error is None:
            for key in keys:
                self.durable(key)
        else:
            self._failed(keys, "journal")

    def _failed(self, keys: Iterable[Key], way: str) -> None:
        for key in keys:
            ack = self._waiting.get(key)
            if ack is None:
                continue
            ack.failed.add(way)
            if len(ack.failed) == ack.ways and not ack.done.done():
                ack.done.set_result(False)  # stays listed: a later write may still make it durable

    @property
    def waiting(self) -> int:
        return len(self._waiting)
