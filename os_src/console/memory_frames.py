"""The memory frames of the wire format: what a client (the console) asks about memory, and
the answers. docs/protocol.md documents each with an example; keep the two in step. How a
request and its answer work (request_id, errors) is console/requests.py's.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from .requests import MAX_INT64, Reply, Request, RequestFailed, RequestIdOnly

__all__ = ["RequestFailed", "RequestIdOnly"]  # kept here too: the memory requests' callers raise and read them

MAX_QUERY = 2_000  # characters of a search query (search looks at no more)
MAX_EDIT = 100_000  # characters of an edited file; the file's own limits are checked after
MAX_RESULTS = 50

FileName = Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
VersionNumber = Annotated[int, msgspec.Meta(ge=1, le=MAX_INT64)]
RowId = Annotated[int, msgspec.Meta(ge=1, le=MAX_INT64)]
LearningType = Literal["FACT", "PATTERN", "CORRECTION", "PREFERENCE", "ACTION", "TOOL_INSTALL", "SUMMARY", "EPISODE"]


# ---------------------------------------------------------------- client -> server


class MemoryRequest(Request, frozen=True, kw_only=True):
    pass


class MemoryFilesRequest(MemoryRequest, tag="memory_files", frozen=True):
    """The six files, each with its size against its limits."""


class MemoryFileRequest(MemoryRequest, tag="memory_file", frozen=True):
    """One file's text and its version history."""

    name: FileName


class MemoryVersionRequest(MemoryRequest, tag="memory_version", frozen=True):
    """One version's text, and its diff against the version before it."""

    name: FileName
    number: VersionNumber


class MemoryEditRequest(MemoryRequest, tag="memory_edit", frozen=True):
    """A person's own edit of a curated file. `base_sha256` is the file the edit started
    from: if the file changed since (the daemon rewrote it), nothing is written."""

    name: FileName
    text: Annotated[str, msgspec.Meta(max_length=MAX_EDIT)]
    base_sha256: Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")]


class MemoryRollbackRequest(MemoryRequest, tag="memory_rollback", frozen=True):
    name: FileName
    number: VersionNumber


class MemorySearchRequest(MemoryRequest, tag="memory_search", frozen=True):
    """Learnings matching `query`, best first; without a query, the newest. `forgotten`
    lists the forgotten ones instead (newest forgetting first), to undo a forgetting."""

    query: Annotated[str, msgspec.Meta(max_length=MAX_QUERY)] = ""
    types: list[LearningType] = msgspec.field(default_factory=list)
    forgotten: bool = False
    limit: Annotated[int, msgspec.Meta(ge=1, le=MAX_RESULTS)] = 20


class MemoryTurnRequest(MemoryRequest, tag="memory_turn", frozen=True):
    """One recorded turn from transcript.db, by its observation id."""

    observation_id: RowId


class MemoryForgetRequest(MemoryRequest, tag="memory_forget", frozen=True):
    learning_id: RowId


class MemoryUnforgetRequest(MemoryRequest, tag="memory_unforget", frozen=True):
    learning_id: RowId


class MemoryAuditRequest(MemoryRequest, tag="memory_audit", frozen=True):
    limit: Annotated[int, msgspec.Meta(ge=1, le=MAX_RESULTS)] = 20


class MemoryHealthRequest(MemoryRequest, tag="memory_health", frozen=True):
    pass


class MemoryBootPromptRequest(MemoryRequest, tag="memory_boot_prompt", frozen=True):
    pass


AnyMemoryRequest = (
    MemoryFilesRequest | MemoryFileRequest | MemoryVersionRequest | MemoryEditRequest | MemoryRollbackRequest
    | MemorySearchRequest | MemoryTurnRequest | MemoryForgetRequest | MemoryUnforgetRequest
    | MemoryAuditRequest | MemoryHealthRequest | MemoryBootPromptRequest
)


# ---------------------------------------------------------------- the parts of answers


class FileInfo(msgspec.Struct, frozen=True):
    name: str
    owner: Literal["deploy", "daemon"]  # deploys write soul.md and os.md; the daemon the other four
    editable: bool  # a person may edit it from the console (the daemon's files)
    lines: int
    max_lines: int
    bytes: int
    max_bytes: int
    versions: int
    sha256: str


class VersionInfo(msgspec.Struct, frozen=True):
    number: int
    created_at: float
    source: str  # e.g. deploy, batch-12, on-disk (an edit found on disk), person-edit, rollback-to-3
    lines: int


class TurnRef(msgspec.Struct, frozen=True):
    """Where a learning came from: turn `sequence_num` of session `session_id`."""

    observation_id: int
    session_id: str
    sequence_num: int
    timestamp: float


class LearningHit(msgspec.Struct, frozen=True):
    kind: Literal["learning", "episode"]  # an episode is a raw turn search found: type EPISODE, id the turn's
    id: int
    type: str
    content: str
    created_at: float
    confidence: float
    score: float | None  # higher is better; None when listed without a query
    session_id: str | None
    turn: TurnRef | None  # None when the curator did not cite a turn
    forgotten_at: float | None


class ToolCall(msgspec.Struct, frozen=True):
    name: str
    input: str
    output: str
    is_error: bool


class TurnRecord(msgspec.Struct, frozen=True):
    observation_id: int
    session_id: str
    sequence_num: int
    timestamp: float
    user_message: str
    tool_calls: list[ToolCall]
    agent_response: str
    processed: Literal["pending", "processed", "stale"]


class AuditEntry(msgspec.Struct, frozen=True):
    id: int
    at: float
    action: Literal["forget", "unforget", "edit", "rollback", "forget_turns"]
    learning_id: int | None
    file: str | None
    detail: str


class BatchInfo(msgspec.Struct, frozen=True):
    id: int
    created_at: float
    trigger: str
    status: str
    turns: int
    learnings_added: int
    cost_usd: float
    error: str | None


class Spend(msgspec.Struct, frozen=True):
    batches: int
    failed_batches: int
    input_tokens: int
    output_tokens: int
    cost_usd: float
    # What the calls' replies said that memory left out (memory_store.LeftOut), summed
    learnings_over_bound: int = 0  # learnings past what one call may keep
    lines_ignored: int = 0  # lines that fit no rule of the format
    files_rejected: int = 0  # file rewrites not applied: given twice, empty, cut off, over their limit, or not the curator's


class RecallProgress(msgspec.Struct, frozen=True):
    """How far search has caught up with the turns: indexed (found by their words) and embedded (found
    by meaning, newest first, in the background), and an import the server is applying."""

    turns: int  # recorded turns made searchable episodes
    waiting_for_index: int
    embedded: int | None = None  # None: no dense retriever
    waiting_for_vectors: int = 0
    per_second: float | None = None  # turns embedded a second, lately
    eta_s: float | None = None
    importing: int | None = None  # turns in the import being applied (None: no import)
    imported: int = 0  # of them, applied so far
    import_failing: str | None = None  # the last attempt's error while imports' attempts fail (retried)
    # Import files the server gave up on (their names in .os/state/imports/): never retried, until the
    # operator renames one back without `.failed`, or removes it.
    import_set_aside: list[str] = []


class ForgetProgress(msgspec.Struct, frozen=True):
    """Forgets not finished: their words are out of every store but the memory files, whose lines the daemon's
    pass takes out next (the boot prompt leaves them out meanwhile). `stuck`: a forget cut short, or one kept a
    minute and more (forget/turns.py's `stuck`); /healthz's memory.forget is degraded then, or while there is any
    `unreadable_backups`."""

    waiting: int  # forgets whose lines are not yet out of the memory files
    cut_short: int = 0  # forgets an error cut short: their turns keep their words until forgotten again, or a restart
    cut_short_in: list[float] = []  # when the sessions holding those turns started (as Past sessions names them)
    cut_short_sessions: int = 0  # of the forgets cut short, those of a whole session (the others named turns)
    kept_for_s: float | None = None  # how long the pass has kept one for later
    kept_why: Literal["disk", "index", "check", "reader", "error"] | None = None  # why (forget/turns.py's KEPT_*)
    stuck: bool = False
    # Backups the pass could not read as databases (paths under .os/, as /healthz's memory.forget names them): they
    # may hold a forgotten turn's words, and are said until the operator removes them.
    unreadable_backups: list[str] = []


class AgentSpend(msgspec.Struct, frozen=True):
    """The agent's own model calls today, as the relay counts them against its daily cap."""

    daily_usd: float
    spent_today_usd: float
    in_flight_usd: float
    calls_today: int
    refused_today: dict[str, int]  # by reason: model, max_tokens, rate, budget, invalid
    resets_at: float


class MemoryHealth(msgspec.Struct, frozen=True):
    running: bool  # a batch is running now
    failing: bool  # three or more batches failed in a row (/healthz says degraded)
    consecutive_failures: int
    last_error: str | None
    next_retry_at: float | None
    last_success_at: float | None
    last_batch: BatchInfo | None
    today: Spend  # since midnight UTC
    total: Spend
    observations: dict[str, int]  # pending, processed, stale, total
    learnings: int
    forgotten: int
    pending_actions: int
    recall: RecallProgress | None = None
    agent: AgentSpend | None = None  # the agent's spending beside the curator's (None: no relay to ask)
    forgets: ForgetProgress | None = None


# ---------------------------------------------------------------- server -> client


class MemoryReply(Reply, frozen=True, kw_only=True):
    pass


class MemoryFilesResult(MemoryReply, tag="memory_files_result", frozen=True):
    files: list[FileInfo]


class MemoryFileResult(MemoryReply, tag="memory_file_result", frozen=True):
    file: FileInfo
    text: str
    history: list[VersionInfo]  # oldest first


class MemoryVersionResult(MemoryReply, tag="memory_version_result", frozen=True):
    name: str
    version: VersionInfo
    text: str
    previous: int | None  # the version the diff is against; None for the first
    diff: str  # unified diff from `previous` (or from nothing) to this version


class MemoryEditResult(MemoryReply, tag="memory_edit_result", frozen=True):
    file: FileInfo
    version: VersionInfo


class MemoryRollbackResult(MemoryReply, tag="memory_rollback_result", frozen=True):
    file: FileInfo
    version: VersionInfo  # the new version: a rollback is a new version, history only grows


class MemorySearchResult(MemoryReply, tag="memory_search_result", frozen=True):
    hits: list[LearningHit]


class MemoryTurnResult(MemoryReply, tag="memory_turn_result", frozen=True):
    turn: TurnRecord


class MemoryForgetResult(MemoryReply, tag="memory_forget_result", frozen=True):
    learning: LearningHit


class MemoryUnforgetResult(MemoryReply, tag="memory_unforget_result", frozen=True):
    learning: LearningHit


class MemoryAuditResult(MemoryReply, tag="memory_audit_result", frozen=True):
    entries: list[AuditEntry]  # newest first


class MemoryHealthResult(MemoryReply, tag="memory_health_result", frozen=True):
    health: MemoryHealth


class MemoryBootPromptResult(MemoryReply, tag="memory_boot_prompt_result", frozen=True):
    text: str
    chars: int
    tokens_estimate: int
    estimate: str  # how tokens_estimate was reached


AnyMemoryReply = (
    MemoryFilesResult | MemoryFileResult | MemoryVersionResult | MemoryEditResult | MemoryRollbackResult
    | MemorySearchResult | MemoryTurnResult | MemoryForgetResult | MemoryUnforgetResult
    | MemoryAuditResult | MemoryHealthResult | MemoryBootPromptResult
)
