"""What the runtime needs from the memory system, and nothing more: the port between the two.

The runtime depends on these protocols, not on memory/system.py, so the data path stays one-way
(runtime -> memory) and a runtime with memory off, or a fake in a unit test, needs no database.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # the agent SDK (a second of imports) loads with the first agent, not the server
    from claude_agent_sdk import HookMatcher, Message, ResultMessage


class TurnRecord(Protocol):
    """One turn as memory captures it (memory/capture/recorder.py): closed once, when the turn ends.
    `durable()`, once closed: True when the turn is on disk, False when it can't be for now.
    `interrupted(by_server)`: someone stopped it, the person or the server's stop; the first names it."""

    def observe(self, message: Message) -> None: ...
    def interrupted(self, by_server: bool = False) -> None: ...
    def close(self, result: ResultMessage | None, error: str | None = None, cost_usd: float | None = None) -> None: ...
    async def durable(self) -> bool: ...


class RecalledMemory(Protocol):
    """One memory auto-recall added (memory/recall/searcher.py's RecallHit)."""

    @property
    def kind(self) -> str: ...  # episode | learning
    @property
    def id(self) -> int: ...
    @property
    def type(self) -> str: ...
    @property
    def at(self) -> float: ...
    @property
    def session_id(self) -> str | None: ...
    @property
    def turn(self) -> int | None: ...
    @property
    def observation_id(self) -> int | None: ...
    @property
    def snippet(self) -> str: ...
    @property
    def score(self) -> float: ...


class Recalled(Protocol):
    """What auto-recall added to a message (memory/recall/service.py); agent/frames.py tells clients."""

    @property
    def context(self) -> str: ...
    @property
    def memories(self) -> Sequence[RecalledMemory]: ...
    @property
    def tokens(self) -> int: ...


class TakenMessage(Protocol):
    """A message a turn in the record ran (transcript.db's turn_clients): its client id, and where it ran."""

    @property
    def client_id(self) -> str: ...
    @property
    def session_id(self) -> str: ...
    @property
    def turn_id(self) -> str | None: ...


class AgentMemory(Protocol):
    """What the runtime needs from the memory system (memory/system.py)."""

    def hooks(self) -> dict[Any, list[HookMatcher]]: ...
    async def boot_prompt(self, settle: bool = True) -> str: ...
    def session_started(self, session_id: str) -> None: ...
    def session_ended(self, session_id: str, reason: str) -> None: ...
    def turn_started(self, prompt: str, turn_id: str, client_id: str | None) -> TurnRecord: ...
    def turn_ended(self) -> None: ...
    def message_arrived(self, message: str, session_id: str) -> None: ...  # its recall may begin now
    async def recall_for(self, message: str, session_id: str, turn_id: str) -> Recalled | None: ...
    async def taken_messages(self, limit: int) -> Sequence[TakenMessage]: ...  # the newest `limit`, newest first


class NoRecord:
    """The record of a turn when memory is off: it keeps nothing."""

    def observe(self, message: Message) -> None:
        pass

    def interrupted(self, by_server: bool = False) -> None:
        pass

    def close(self, result: ResultMessage | None, error: str | None = None, cost_usd: float | None = None) -> None:
        pass

    async def durable(self) -> bool:
        return True
