"""Every failure Sprite OS raises on purpose, under one base.

A caller catches the subclass it can act on; a command-line entry point catches
`SpriteOSError` and prints its message, which is always one line fit for a
terminal, then exits with the error's `exit_code`: 2 when the command refused to
run (fix what the message names and run it again), 1 when it ran and failed.
Standard library only.

Two subclasses live with their types: `protocol.FrameError`, whose `code` is a
`protocol.ErrorCode`, and `protocol_memory.RequestFailed`, the same for memory requests.
"""

from __future__ import annotations


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


class BudgetSpent(SpriteOSError):
    """The curator's daily budget can't cover the next call: it waits for the next UTC day. No failure."""

    def __init__(self, message: str, resumes_at: float) -> None:
        super().__init__(message)
        self.resumes_at = resumes_at
