"""The console's requests on the WebSocket, and their routing.

A client asks with a `request_id` of its choosing; the answer goes to that connection alone,
is the request's type with `_result` appended, and repeats the `request_id` (its `seq`, as a
`pong`'s, repeats the last event number the connection was sent). A request that cannot be
answered raises `RequestFailed`, which the gateway sends as an `error` frame carrying the
same `request_id`. Memory (memory_frames.py), past sessions (session_frames.py), the
person's files (files_frames.py) and cards (card_frames.py) each define their requests on these bases; `ConsoleApi`
hands each to its handler.

These Structs share protocol.py's tag field (`type`) but not its base classes, so that
protocol.py can add them to its unions without an import cycle.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar
from typing import Annotated, Any, ClassVar, Literal

import msgspec

from ..errors import SpriteOSError

MAX_REQUEST_ID = 128
# The connection a request came on, as the gateway's request task sets it: what a download or an
# upload is owned by ("" outside a connection, as in unit tests).
client: ContextVar[str] = ContextVar("console_client", default="")

RequestId = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_REQUEST_ID)]


class Request(msgspec.Struct, tag_field="type", frozen=True, kw_only=True):
    # A slow request (a forget: seconds) is answered aside: by a task of its own on the
    # connection, in order with the other aside ones, while the quick ones go on being answered.
    aside: ClassVar[bool] = False

    request_id: RequestId


class Reply(msgspec.Struct, tag_field="type", frozen=True, kw_only=True):
    seq: int = 0
    request_id: str


# The largest number a request may carry where one is stored or seeked: SQLite's integers and
# the kernel's file offsets are 64-bit signed; beyond it, a bad_request, never an internal_error.
MAX_INT64 = 2**63 - 1

# The error codes of requests (protocol.ErrorCode holds them too, with the rest).
RequestErrorCode = Literal[
    "not_found",  # no such memory file, version, learning, turn, session, file or folder
    "not_editable",  # soul.md and os.md are the deploy's: edit them in a release
    "over_limit",  # the edit is over the file's line or byte limit; nothing was written
    "file_changed",  # the file changed since the edit began (nothing was written), or a download's was written to
    "not_durable",  # the edit, rollback or upload was done, but the disk failed to confirm it is stored:
    # not to be sent again
    "memory_unavailable",  # this server runs without memory
    "bad_path",  # a path outside the person's files: .., an absolute path, .os/, a link
    "too_large",  # an upload over the size limit, or a file too large to download here
    "upload_failed",  # the upload could not be written (the disk, a chunk out of order); nothing of it kept
    "busy",  # a turn is running in the session to forget, as many downloads as allowed are open, or the
    # download or upload asked for is another connection's (until that one ends)
]


class RequestFailed(SpriteOSError):
    """A request that cannot be answered: an `error` frame with its request_id."""

    def __init__(self, code: RequestErrorCode, message: str) -> None:
        super().__init__(message)
        self.code: RequestErrorCode = code
        self.message = message


class RequestIdOnly(msgspec.Struct):
    """What is read of a request that failed validation, to tag its error."""

    request_id: str | None = None


Handler = Callable[[Any], Awaitable[Reply]]


class ConsoleApi:
    """Every request type, to its handler. A type with none (memory's and past sessions', on a
    server that runs without memory) is answered `memory_unavailable`."""

    def __init__(self, *handlers: Mapping[type[Request], Handler]) -> None:
        self._handlers: dict[type[Request], Handler] = {}
        for group in handlers:
            self._handlers.update(group)

    async def handle(self, request: Request) -> Reply:
        handler = self._handlers.get(type(request))
        if handler is None:
            raise RequestFailed("memory_unavailable", "this server runs without memory")
        return await handler(request)
