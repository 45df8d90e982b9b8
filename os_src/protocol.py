"""The wire format between clients and Sprite OS: JSON text frames tagged by `type`.

Every frame is a msgspec Struct, so decoding and validation are one step and an
invalid frame is rejected with a precise reason. docs/protocol.md documents each
frame with an example; keep the two in step.

Sequence numbers: every server frame carries `seq`. Broadcast events (what the
agent does, card changes, session changes) each take the next number, and are
kept in a bounded buffer for replay. Replies to one connection (`ready`, `pong`,
an `error` about that client's own frame) repeat the latest number, so the
largest `seq` a client has seen is always a valid place to resume from.
"""

from __future__ import annotations

from typing import Annotated, Literal, TypeVar

import msgspec

from .console.card_frames import CardCloseRequest, CardCloseResult
from .console.files_frames import AnyFilesReply, AnyFilesRequest
from .console.memory_frames import AnyMemoryReply, AnyMemoryRequest
from .console.requests import RequestErrorCode
from .console.session_frames import AnySessionReply, AnySessionRequest
from .errors import SpriteOSError

PROTOCOL_VERSION = 1
SUBPROTOCOL = "sprite-os.v1"  # WebSocket subprotocol; browsers also offer "bearer.<token>"

MAX_USER_TEXT = 100_000  # characters in one user_message
MAX_ID = 128  # characters in client-chosen ids and nonces
MAX_QUEUED_MESSAGES = 16  # user messages waiting for the agent; past it one is refused `queue_full`

ShortText = Annotated[str, msgspec.Meta(max_length=MAX_ID)]


# ---------------------------------------------------------------- client -> server


class ClientFrame(msgspec.Struct, tag_field="type", frozen=True):
    """Base of every frame a client sends. Unknown fields are ignored, for forward compatibility."""


class Hello(ClientFrame, tag="hello", frozen=True):
    """First frame of a connection. With `last_seq` (and the `stream` it came from), the
    server replays what the client missed; without, it sends a fresh snapshot."""

    protocol: int = PROTOCOL_VERSION
    last_seq: Annotated[int, msgspec.Meta(ge=0)] | None = None
    stream: ShortText | None = None
    client: ShortText | None = None


class UserMessage(ClientFrame, tag="user_message", frozen=True):
    text: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_USER_TEXT)]
    client_id: ShortText | None = None  # echoed in turn_started, to match a message to its turn


class Interrupt(ClientFrame, tag="interrupt", frozen=True):
    pass


class NewSession(ClientFrame, tag="new_session", frozen=True):
    pass


class Ping(ClientFrame, tag="ping", frozen=True):
    nonce: ShortText | None = None


# Requests answered to their connection alone (console/requests.py): memory, past sessions, cards, files.
AnyClientFrame = (Hello | UserMessage | Interrupt | NewSession | Ping | AnyMemoryRequest | AnySessionRequest
                  | CardCloseRequest | AnyFilesRequest)


# ---------------------------------------------------------------- server -> client

AgentState = Literal["idle", "starting", "running", "stopping"]
CardKind = Literal["note", "task", "document", "data", "alert"]
TurnStatus = Literal["completed", "interrupted", "error"]
SessionEndReason = Literal["new_session", "forget", "idle", "shutdown", "crash"]

ErrorCode = Literal[
    "invalid_json",  # the frame is not JSON
    "invalid_frame",  # a field is missing or has the wrong type or size
    "unknown_type",  # `type` names no client frame
    "binary_not_supported",  # frames are JSON text, never binary
    "frame_too_large",  # over 1 MiB (gateway.MAX_FRAME_CHARS); over 4 MiB closes the connection
    "rate_limited",  # too many frames too fast; the frame was dropped
    "unsupported_protocol",  # hello.protocol is newer than this server speaks
    "queue_full",  # too many messages waiting for the agent
    "already_taken",  # the user_message's client_id names a message the agent took already: not run again
    "nothing_to_interrupt",  # interrupt while the agent is idle
    "agent_failed",  # the agent's CLI process failed; the next message starts a fresh one
    "model_unavailable",  # the model proxy failed the turn (HTTP error, unreachable)
    "agent_limit",  # the Sprite refused the agent's call: its daily budget, a model or size it may not use
    "not_saved",  # the turn is over but could not be saved to disk yet (sent before its turn_complete)
    "shutting_down",  # the server is stopping: a message or new_session was not accepted
    "internal_error",  # a bug handling the frame; the connection stays open
    RequestErrorCode,  # answers to requests (console/requests.py); these errors carry the request_id
]


class Card(msgspec.Struct, frozen=True):
    id: str
    title: str
    body: str
    kind: CardKind
    created_at: float
    updated_at: float


class Usage(msgspec.Struct, frozen=True):
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0


class ServerFrame(msgspec.Struct, tag_field="type", kw_only=True, frozen=True):
    seq: int = 0


class Ready(ServerFrame, tag="ready", frozen=True):
    """Answer to hello: who the server is and the state to render. When `replayed` > 0,
    that many missed events follow, in order. `resync` means the client's `last_seq`
    was too old (or from another stream) to replay, so this snapshot replaces its state."""

    protocol: int
    server_version: str
    stream: str
    session_id: str
    last_seq: int
    agent: AgentState
    turn_id: str | None
    cards: list[Card]
    replayed: int = 0
    resync: bool = False
    turn_text: str | None = None  # the running turn's message, so a client joining mid-turn can show it
    turn_client_id: str | None = None  # the running turn's message's client id: a reloaded page knows its own
    waiting: list[str] = msgspec.field(default_factory=list)  # client ids of the messages queued for the agent
    # Whether this server knows the client ids of the commands an earlier run took (memory on, its record read
    # at start): only then does resending a command with its own id ask whether it ran (else it may run again).
    knows_commands: bool = False


class SessionStarted(ServerFrame, tag="session_started", frozen=True):
    session_id: str


class SessionEnded(ServerFrame, tag="session_ended", frozen=True):
    session_id: str
    reason: SessionEndReason


class TurnStarted(ServerFrame, tag="turn_started", frozen=True):
    """A user message reached the agent. Sent to every client, so each device shows it."""

    turn_id: str
    text: str
    client_id: str | None = None


class TextDelta(ServerFrame, tag="text_delta", frozen=True):
    turn_id: str
    text: str


class AssistantMessage(ServerFrame, tag="assistant_message", frozen=True):
    """One complete assistant message; it replaces the text_deltas streamed before it."""

    turn_id: str
    text: str


class ToolUse(ServerFrame, tag="tool_use", frozen=True):
    turn_id: str
    tool_use_id: str
    name: str
    summary: str


class ToolResult(ServerFrame, tag="tool_result", frozen=True):
    turn_id: str
    tool_use_id: str
    is_error: bool
    summary: str


class RecalledMemory(msgspec.Struct, frozen=True):
    kind: Literal["episode", "learning"]
    id: int  # an episode's observation id, or a learning's id
    type: str  # EPISODE, or the learning's type (FACT, CORRECTION, SUMMARY...)
    at: float  # the turn's date, or when the learning was made
    session_id: str | None  # the episode's session, or the session the learning came from
    turn: int | None  # 1-based turn within that session
    observation_id: int | None  # the turn in the transcript
    snippet: str
    score: float  # higher is better


class Recall(ServerFrame, tag="recall", frozen=True):
    """Auto-recall: memories that went to the agent with the message of `turn_id`, as added context."""

    turn_id: str
    memories: list[RecalledMemory]
    tokens: int  # estimated size of the added context


class CardCreated(ServerFrame, tag="card_created", frozen=True):
    card: Card


class CardUpdated(ServerFrame, tag="card_updated", frozen=True):
    card: Card


class CardClosed(ServerFrame, tag="card_closed", frozen=True):
    card_id: str


class TurnsForgotten(ServerFrame, tag="turns_forgotten", frozen=True):
    """A person forgot these turns of `session_id` (by their number in it, and their wire ids): their
    words are gone; show a tombstone where they were."""

    session_id: str
    turns: list[int]
    turn_ids: list[str]
    forgotten_at: float


class FileUploaded(ServerFrame, tag="file_uploaded", frozen=True):
    """A person uploaded a file through the console: it is in their files, at `path`."""

    path: str
    size: int


class TurnComplete(ServerFrame, tag="turn_complete", frozen=True):
    turn_id: str
    status: TurnStatus
    duration_ms: int
    usage: Usage
    cost_usd: float | None = None  # this turn's own cost (None: the CLI reported none)
    session_cost_usd: float | None = None  # the session's turns so far, this one included
    # False: the turn could not be made durable yet (an `error` with code not_saved came first).
    # A default, so clients that predate it read every frame the same.
    saved: bool = True
    # True on an `interrupted` turn that the server's stop or restart cut short, not the person (its
    # record says `stopped`). A default, like `saved`: a client that predates it reads `interrupted`.
    by_server: bool = False


class ModelRetry(ServerFrame, tag="model_retry", frozen=True):
    """A request of the turn to the model proxy failed; the CLI tries it again in
    `retry_delay_ms`. Sent at each retry, as it is decided, so a turn against a proxy that is
    down or overloaded is never silent. `error_status` is the HTTP status (None: no answer at
    all, such as a refused connection); `error` is the CLI's category (`overloaded`,
    `rate_limit`, `server_error`, ...)."""

    turn_id: str
    attempt: int
    max_retries: int
    retry_delay_ms: int
    error_status: int | None = None
    error: str = ""


class Error(ServerFrame, tag="error", frozen=True):
    code: ErrorCode
    message: str  # plain words for a person
    turn_id: str | None = None
    request_id: str | None = None  # set when the error answers a request (memory, sessions, files)
    # Set when the error refuses a user_message that carried one: that message was not taken (never
    # on internal_error, whose bug may have struck after the message was queued); on already_taken, it
    # was taken before, as `session_id` and `turn_id` (where known), and is not run again.
    client_id: str | None = None
    session_id: str | None = None
    detail: str | None = None  # what the agent's CLI said, for a details view: addresses, codes


class Pong(ServerFrame, tag="pong", frozen=True):
    nonce: str | None = None


AnyServerFrame = (
    Ready
    | SessionStarted
    | SessionEnded
    | TurnStarted
    | TextDelta
    | AssistantMessage
    | ToolUse
    | ToolResult
    | Recall
    | CardCreated
    | CardUpdated
    | CardClosed
    | FileUploaded
    | TurnsForgotten
    | TurnComplete
    | ModelRetry
    | Error
    | Pong
    | AnyMemoryReply
    | AnySessionReply
    | CardCloseResult
    | AnyFilesReply
)


# ---------------------------------------------------------------- coding

_client_decoder: msgspec.json.Decoder[AnyClientFrame] = msgspec.json.Decoder(AnyClientFrame)
_server_decoder: msgspec.json.Decoder[AnyServerFrame] = msgspec.json.Decoder(AnyServerFrame)
_encoder = msgspec.json.Encoder()


class FrameError(SpriteOSError):
    """A client frame was rejected. `code` is stable; `message` is for people."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code: ErrorCode = code
        self.message = message


def decode_client_frame(data: str | bytes) -> AnyClientFrame:
    """Decode and validate one client frame, or raise FrameError saying what is wrong."""
    try:
        return _client_decoder.decode(data)
    except msgspec.ValidationError as exc:
        text = str(exc)
        if text.startswith("Invalid value") and text.endswith("at `$.type`"):
            return _raise("unknown_type", f"unknown frame type: {text.split(chr(39))[1]!r}")
        if text == "Object missing required field `type`":
            return _raise("invalid_frame", "frame has no `type` field")
        if text == f"Expected `str` of length <= {MAX_USER_TEXT} - at `$.text`":  # said plainly, to a person
            return _raise("invalid_frame", too_long(_text_length(data)))
        return _raise("invalid_frame", text)
    except msgspec.DecodeError as exc:
        return _raise("invalid_json", f"frame is not valid JSON: {exc}")
    except UnicodeDecodeError:
        return _raise("invalid_json", "frame is not valid UTF-8")
    except RecursionError:  # msgspec recurses into what it skips: a value nested 100,000 deep
        return _raise("invalid_frame", "frame is nested too deeply")


def _raise(code: ErrorCode, message: str) -> AnyClientFrame:
    raise FrameError(code, message)


def too_long(length: int) -> str:
    """What a message over MAX_USER_TEXT is told (the console's page says the same)."""
    return f"the message is too long to send: {length:,} characters, and the limit is {MAX_USER_TEXT:,}"


class _UserMessageText(msgspec.Struct):
    text: str = ""


def _text_length(data: str | bytes) -> int:
    """The length of a user_message's text that was refused as too long."""
    return len(msgspec.json.decode(data, type=_UserMessageText).text)


class RefusedIds(msgspec.Struct):
    """What is read of a frame refused before it was taken (it failed validation, came too fast or too
    large), so that its sender knows which it was: a request's `request_id`, a user_message's `client_id`."""

    type: str = ""
    request_id: str | None = None
    client_id: ShortText | None = None


def ids_of(data: str | bytes) -> RefusedIds:
    """The ids a refused frame has, read in one decode (none when it has no readable ones). msgspec
    builds only these three fields: the rest of the frame is scanned, not built."""
    try:
        ids = msgspec.json.decode(data, type=RefusedIds)
    except (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        return RefusedIds()
    if ids.type != "user_message":  # a client_id names a message; on anything else it means nothing
        ids.client_id = None
    return ids


def encode(frame: msgspec.Struct) -> bytes:
    return _encoder.encode(frame)


def decode_server_frame(data: str | bytes) -> AnyServerFrame:
    """For clients (the terminal chat, tests, benchmarks)."""
    return _server_decoder.decode(data)


Reply = TypeVar("Reply", bound=msgspec.Struct)  # a ServerFrame, or a request's answer


def with_seq(frame: Reply, seq: int) -> Reply:
    return msgspec.structs.replace(frame, seq=seq)
