"""Canvas cards: what the agent shows the user beside the conversation.

The agent creates, updates, closes and lists cards through SDK MCP tools. The
open cards persist under `.os/state/`, so they survive a restart and are part
of every `ready` snapshot; each change is broadcast to every client.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import msgspec

from ..errors import CanvasError
from ..fsutil import atomic_write
from ..logs import get_logger
from ..protocol import Card, CardClosed, CardCreated, CardKind, CardUpdated, ServerFrame
from ..text import clean_json

if TYPE_CHECKING:  # the agent SDK (a second of imports) loads with the first agent, not the server
    from claude_agent_sdk import SdkMcpTool
    from claude_agent_sdk.types import McpSdkServerConfig

log = get_logger(__name__)

SERVER_NAME = "canvas"
MAX_OPEN_CARDS = 100
MAX_BODY = 64_000

CardId = Annotated[str, msgspec.Meta(pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$")]
Title = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
Body = Annotated[str, msgspec.Meta(max_length=MAX_BODY)]


class CreateCard(msgspec.Struct, forbid_unknown_fields=True):
    """Show a new card to the user."""

    title: Title
    body: Body = ""
    kind: CardKind = "note"
    id: CardId | None = None


class UpdateCard(msgspec.Struct, forbid_unknown_fields=True):
    """Change an open card; fields left out keep their value."""

    id: CardId
    title: Title | None = None
    body: Body | None = None
    kind: CardKind | None = None


class CloseCard(msgspec.Struct, forbid_unknown_fields=True):
    """Remove an open card from the user's canvas."""

    id: CardId


class ListCards(msgspec.Struct, forbid_unknown_fields=True):
    """List the cards open on the user's canvas."""


class CanvasStore:
    """The open cards. One asyncio lock orders changes; the file write runs off the loop."""

    def __init__(self, path: Path, publish: Callable[[ServerFrame], None]) -> None:
        self._path = path
        self._publish = publish
        self._cards: dict[str, Card] = {}
        self._lock = asyncio.Lock()

    def load(self) -> None:
        """Read saved cards. A damaged file is set aside, not fatal: the canvas starts empty."""
        try:
            self._cards = {c.id: c for c in msgspec.json.decode(self._path.read_bytes(), type=list[Card])}
        except FileNotFoundError:
            self._cards = {}
        except (msgspec.DecodeError, OSError) as exc:
            aside = self._path.with_name(f"{self._path.name}.damaged-{int(time.time())}")
            self._path.replace(aside)
            log.error("canvas_file_damaged", path=str(self._path), moved_to=str(aside), error=str(exc))
            self._cards = {}

    def cards(self) -> list[Card]:
        return list(self._cards.values())

    async def create(self, req: CreateCard) -> Card:
        async with self._lock:
            if len(self._cards) >= MAX_OPEN_CARDS:
                raise CanvasError(f"{MAX_OPEN_CARDS} cards are open; close some before creating more")
            card_id = req.id or self._new_id(req.title)
            if card_id in self._cards:
                raise CanvasError(f"a card with id {card_id!r} is already open; update it or choose another id")
            now = time.time()
            card = Card(id=card_id, title=req.title, body=req.body, kind=req.kind, created_at=now, updated_at=now)
            await self._commit({**self._cards, card_id: card})
        self._publish(CardCreated(card=card))
        return card

    async def update(self, req: UpdateCard) -> Card:
        async with self._lock:
            old = self._get(req.id)
            changes = {k: v for k in ("title", "body", "kind") if (v := getattr(req, k)) is not None}
            card = msgspec.structs.replace(old, **changes, updated_at=time.time())
            await self._commit({**self._cards, card.id: card})
        self._publish(CardUpdated(card=card))
        return card

    async def close(self, req: CloseCard) -> Card:
        async with self._lock:
            card = self._get(req.id)
            await self._commit({k: v for k, v in self._cards.items() if k != card.id})
        self._publish(CardClosed(card_id=card.id))
        return card

    def _get(self, card_id: str) -> Card:
        try:
            return self._cards[card_id]
        except KeyError:
            open_ids = ", ".join(self._cards) or "none"
            raise CanvasError(f"no open card has id {card_id!r} (open: {open_ids})") from None

    def _new_id(self, title: str) -> str:
        base = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")[:56] or "card"
        if not base[0].isalnum():
            base = "card-" + base
        candidate, n = base, 2
        while candidate in self._cards:
            candidate, n = f"{base}-{n}", n + 1
        return candidate

    async def _commit(self, cards: dict[str, Card]) -> None:
        """Save first, then adopt: if the save fails, the canvas is unchanged on disk and in memory."""
        data = msgspec.json.encode(list(cards.values()))
        await asyncio.to_thread(atomic_write, self._path, data)
        self._cards = cards


# ---------------------------------------------------------------- the tools


def _schema(cls: type[msgspec.Struct]) -> dict[str, Any]:
    """msgspec's JSON schema for a struct, inlined: the model sees plain properties."""
    schema = msgspec.json.schema(cls)
    return schema["$defs"][cls.__name__] if "$defs" in schema else schema


def _ok(payload: Any) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": msgspec.json.encode(payload).decode()}]}


def _error(message: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": message}], "is_error": True}


def _handler(cls: type[msgspec.Struct], action: Callable[[Any], Any]) -> Callable[[dict[str, Any]], Any]:
    async def run(args: dict[str, Any]) -> dict[str, Any]:
        try:
            req = msgspec.convert(clean_json(args), cls)
        except msgspec.ValidationError as exc:
            return _error(f"invalid input: {exc}")
        try:
            return _ok(await action(req))
        except CanvasError as exc:
            return _error(str(exc))
        except OSError as exc:
            log.error("canvas_save_failed", error=exc.strerror or repr(exc))
            return _error(f"the canvas could not be saved ({exc.strerror}); nothing changed")

    return run


def canvas_tools(store: CanvasStore) -> list[SdkMcpTool[Any]]:
    from claude_agent_sdk import tool

    async def list_cards(_: ListCards) -> list[Card]:
        return store.cards()

    specs: list[tuple[str, str, type[msgspec.Struct], Callable[[Any], Any]]] = [
        ("create_card", "Show the user a new card (markdown body). Returns the card with its id.",
         CreateCard, store.create),
        ("update_card", "Change an open card's title, body or kind by id.", UpdateCard, store.update),
        ("close_card", "Remove an open card from the user's canvas by id.", CloseCard, store.close),
        ("list_cards", "List the cards open on the user's canvas.", ListCards, list_cards),
    ]
    return [tool(name, desc, _schema(cls))(_handler(cls, action)) for name, desc, cls, action in specs]


def canvas_server(store: CanvasStore) -> McpSdkServerConfig:
    from claude_agent_sdk import create_sdk_mcp_server

    return create_sdk_mcp_server(SERVER_NAME, tools=canvas_tools(store))

