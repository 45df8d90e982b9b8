"""The card frames a person sends from the console: closing a card (the agent closes them with
its canvas tool; either way every client gets `card_closed`). Requests and answers work as
console/requests.py says; console/cards.py answers them.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from .requests import Reply, Request

CardId = Annotated[str, msgspec.Meta(min_length=1, max_length=64)]  # an id no card has is not_found


class CardCloseRequest(Request, tag="card_close", frozen=True):
    card_id: CardId


class CardCloseResult(Reply, tag="card_close_result", frozen=True):
    card_id: str
