"""A person's own hand on the canvas: closing a card from the console. Expanding and copying a
card happen in the page alone.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import CanvasError
from ..tools.canvas import CanvasStore, CloseCard
from .card_frames import CardCloseRequest, CardCloseResult
from .requests import Handler, Request, RequestFailed


class CardsConsole:
    def __init__(self, store: CanvasStore) -> None:
        self._store = store

    @property
    def handlers(self) -> Mapping[type[Request], Handler]:
        return {CardCloseRequest: self._close}

    async def _close(self, req: CardCloseRequest) -> CardCloseResult:
        try:
            card = await self._store.close(CloseCard(id=req.card_id))
        except CanvasError as exc:
            raise RequestFailed("not_found", str(exc)) from None
        return CardCloseResult(request_id=req.request_id, card_id=card.id)
