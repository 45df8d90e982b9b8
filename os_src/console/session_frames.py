"""The conversation as Sprite OS recorded it: past sessions, and a session's turns a page at a
time, so a reload, a new device or a person looking back sees what was said. docs/protocol.md
documents each frame; requests and answers work as console/requests.py says.
"""

from __future__ import annotations

from typing import Annotated, ClassVar

import msgspec

from .memory_frames import ToolCall
from .requests import MAX_INT64, Reply, Request

SessionId = Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
MAX_SESSIONS = 50
TURNS_PER_PAGE = 100
MAX_FORGET = 1_000  # turns named in one forget_turns


class SessionsRequest(Request, tag="sessions", frozen=True):
    """Sessions that had a turn, newest first. `before` (a session id from the last page) pages back."""

    before: SessionId | None = None
    limit: Annotated[int, msgspec.Meta(ge=1, le=MAX_SESSIONS)] = 20


class SessionTurnsRequest(Request, tag="session_turns", frozen=True):
    """A session's turns, the newest page first and each page oldest first. `session_id` None is
    the current session; `before` (a turn number from the last page) pages back."""

    session_id: SessionId | None = None
    before: Annotated[int, msgspec.Meta(ge=1, le=MAX_INT64)] | None = None
    limit: Annotated[int, msgspec.Meta(ge=1, le=TURNS_PER_PAGE)] = 30


class ForgetTurnsRequest(Request, tag="forget_turns", frozen=True):
    """Forget turns for good: by their `observation_ids` (a past turn's), their `turn_ids` (as in
    turn_started), or a whole `session_id`. Their words leave every store; each keeps a tombstone.
    It can take seconds (it waits for the turns still on their way to the transcript, then takes
    the words out of every store): answered aside, so the connection's file listings and download
    chunks don't wait for it."""

    aside: ClassVar[bool] = True

    observation_ids: Annotated[list[Annotated[int, msgspec.Meta(ge=1, le=MAX_INT64)]], msgspec.Meta(max_length=MAX_FORGET)] = (
        msgspec.field(default_factory=list))
    turn_ids: Annotated[list[Annotated[str, msgspec.Meta(min_length=1, max_length=64)]],
                        msgspec.Meta(max_length=MAX_FORGET)] = msgspec.field(default_factory=list)
    session_id: SessionId | None = None


AnySessionRequest = SessionsRequest | SessionTurnsRequest | ForgetTurnsRequest


class SessionInfo(msgspec.Struct, frozen=True):
    id: str
    started_at: float
    ended_at: float | None  # None while it runs, or when the server stopped without ending it
    turns: int
    first_line: str  # the first line of its first message (cut to 160 characters)
    summary: str | None  # the memory curator's one line about it, once it ended and was curated
    cost_usd: float | None  # its turns' costs added up (None: none was reported)
    current: bool  # the session every client is in now
    forgotten: int  # turns a person forgot (tombstones: their words are gone)


class PastTurn(msgspec.Struct, frozen=True):
    observation_id: int | None  # None: still on its way to transcript.db
    turn_id: str | None  # as in turn_started, for turns the runtime ran
    # The id its sender gave the message (user_message's), so a client finds its own message in the record
    # by it; None when sent without one, or recorded before the record kept it.
    client_id: str | None
    turn: int  # 1-based within the session
    at: float
    user_message: str
    agent_response: str
    tool_calls: list[ToolCall]  # each input and output cut to 300 characters
    status: str | None  # completed | interrupted | stopped (by the server's stop) | error (None: recorded before this was kept)
    cost_usd: float | None
    forgotten_at: float | None = None  # a tombstone: the person forgot this turn; its words are gone


class SessionsResult(Reply, tag="sessions_result", frozen=True):
    sessions: list[SessionInfo]
    more: bool  # older sessions follow: ask again with `before` set to the last one's id


class SessionTurnsResult(Reply, tag="session_turns_result", frozen=True):
    session: SessionInfo
    turns: list[PastTurn]  # oldest first
    more: bool  # earlier turns follow: ask again with `before` set to the first one's `turn`


class ForgetTurnsResult(Reply, tag="forget_turns_result", frozen=True):
    forgotten: int  # turns whose words are gone now (turns forgotten before are not counted again)
    learnings: int  # learnings that came from them, deleted with them
    sessions: list[str]
    restarted: bool  # one was the current session's: it was restarted, so the agent's context lets go of it


AnySessionReply = SessionsResult | SessionTurnsResult | ForgetTurnsResult
