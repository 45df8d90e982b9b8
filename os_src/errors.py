"""Every failure Sprite OS raises on purpose, under one base.

A caller catches the subclass it can act on; a command-line entry point catches
`SpriteOSError` and prints its message, which is always one line fit for a
terminal, then exits with the error's `exit_code`: 2 when the command refused to
run (fix what the message names and run it again), 1 when it ran and failed.
Standard library only.

Two subclasses live with their types: `protocol.FrameError`, whose `code` is a
`protocol.ErrorCode`, and `console.requests.RequestFailed`, the same for every console request (memory, past sessions,
files, cards).

Durability: what was or was not kept on disk, and the wire code each becomes.
- `fsutil.NotDurable` (an OSError, from `deploy_contract`): written and in place, but the fsync that
  makes it survive a power loss failed. A console edit or rollback answers `not_durable`, and so does
  an upload through its subclass `console.user_files.Placed` (in documents/, a later step failed):
  done, not to be sent again.
- `fsutil.TornAppend` (an OSError): an append failed and cutting the file back failed too; the turn
  journal's next save rewrites the file whole. No wire code of its own (a turn no way took: `not_saved`).
- `StillSaving` (here): a forget names turns not on disk yet; answered `busy`. Its subclass
  `ForgetWouldMiss`: an unreadable turn journal may hold them, and only the operator (or a restart) ends it.
- `memory.capture.journal.JournalUnreadable` (a SpriteOSError): the turn journal found at start could not
  be read; it is set aside (`/healthz` and `memory status` say so). No wire code.
- A closed turn neither transcript.db nor the journal took is no exception: the server sends the
  event error `not_saved` before its `turn_complete` (`saved: false`). `not_saved` is a turn not on disk
  yet; `not_durable` is a request's result on disk, unconfirmed.
"""

from __future__ import annotations

import errno
import sqlite3
from typing import Any


class SpriteOSError(Exception):
    """Base of every error Sprite OS raises on purpose."""

    exit_code = 1


# ---------------------------------------------------------------- starting and operating


class ConfigError(SpriteOSError):
    """A setting is missing or invalid: fix the environment or the flag it names."""

    exit_code = 2


class UsageError(SpriteOSError):
    """A command asked for something that does not exist (an unknown memory file, a missing version)."""

    exit_code = 2


class PortUnavailable(SpriteOSError):
    """The server cannot listen where it was told to (taken, not ours, unresolvable)."""

    exit_code = 2


class LockHeld(SpriteOSError):
    """Another process holds this workspace's memory writer lock (the server, or a rebuild)."""

    exit_code = 2


class MigrationError(SpriteOSError):
    """The v1 migration cannot go on; nothing was lost."""


# ---------------------------------------------------------------- serving


class QueueFull(SpriteOSError):
    """Too many messages are already waiting for the agent."""


class AlreadyTaken(SpriteOSError):
    """A message whose client id names one the agent took already: it is not run again."""

    def __init__(self, message: str, session_id: str | None = None, turn_id: str | None = None) -> None:
        super().__init__(message)
        self.session_id = session_id
        self.turn_id = turn_id


class ShuttingDown(SpriteOSError):
    """The server is shutting down: no new work is accepted."""


class CanvasError(SpriteOSError):
    """A canvas tool call the model can correct: the message says how."""


# ---------------------------------------------------------------- memory


class CuratorError(SpriteOSError):
    """A curator call failed (proxy down, timeout, HTTP error, a broken body). Retry later."""


class UnusableReply(CuratorError):
    """The proxy answered, but nothing in the reply follows the format (a refusal, garbage, empty).
    Unlike a transport failure, retrying the same turns may never help: the daemon isolates them."""


class EditConflict(SpriteOSError):
    """A person edited a memory file while a batch's call ran; the batch must run again."""


class FileChanged(SpriteOSError):
    """A memory file is not what the writer based its new text on (a person edited it)."""


class StillSaving(SpriteOSError):
    """Turns a forget names still wait to be saved (transcript.db locked or failing): forgetting now
    would miss them, and they would land later, words and all. Try again once they have landed."""


class ForgetWouldMiss(StillSaving):
    """A forget by session or wire id while a turn journal a start could not read is set aside for the
    operator's replay, or stuck where the next start reads it again: it may hold turns the forget would
    miss, which the replay would record, words and all. Not a moment's wait: it lasts until the operator
    replays or removes the journal (`memory status` says how), or a restart reads it."""


class BudgetSpent(SpriteOSError):
    """The curator's daily budget can't cover the next call: it waits for the next UTC day. No failure."""

    def __init__(self, message: str, resumes_at: float) -> None:
        super().__init__(message)
        self.resumes_at = resumes_at


# ---------------------------------------------------------------- conditions, not bugs

# A disk that is full, read-only or failing, or a database another process holds: expected on a
# small machine that runs for years. They are logged as warnings, without a traceback, and retried.
_DISK_ERRNOS = frozenset((errno.ENOSPC, errno.EROFS, errno.EIO, errno.EDQUOT, errno.EAGAIN))
# SQLite's primary result codes for the same: BUSY, LOCKED, READONLY, IOERR, FULL, CANTOPEN.
_SQLITE_CODES = frozenset((5, 6, 8, 10, 13, 14))


def expected(exc: BaseException) -> bool:
    """True if `exc` is a condition of the machine (a lock, a full or failing disk), not a bug."""
    if isinstance(exc, sqlite3.Error):
        code = getattr(exc, "sqlite_errorcode", None)
        return code is not None and code & 0xFF in _SQLITE_CODES
    return isinstance(exc, OSError) and exc.errno in _DISK_ERRNOS


def log_expected(log: Any, event: str, exc: BaseException, **fields: Any) -> None:
    """Log a failure: a warning for an expected condition, an error with its traceback for a bug."""
    if expected(exc):
        log.warning(event, error=type(exc).__name__, detail=str(exc)[:300], **fields)
    else:
        log.error(event, error=repr(exc)[:300], exc_info=exc, **fields)
