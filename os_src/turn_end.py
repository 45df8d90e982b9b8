"""How a turn that ended with the CLI's result ended: one rule, for what the person is told live
(agent/frames.py's turn_complete) and for what the record keeps (memory/capture/recorder.py).

A stop (the person's interrupt, or the server's) can reach the CLI after the answer is whole: the CLI
then ends the turn with a success, and the answer the person got is the whole answer. Such a turn is
`completed`, live and in the record: "interrupted" would tell them they hold part of an answer when they
hold all of it. A turn is interrupted only when someone stopped it AND the CLI says it was cut short.
One cut short that nobody stopped (an API error mid-stream) failed, whatever `is_error` says: the real CLI
sends that result with `is_error: false`, and "completed" would tell the person a part was the whole.
"""

from __future__ import annotations

from typing import Literal

CUT_SHORT = "error_during_execution"  # the CLI's result subtype for a turn it did not end on its own

ResultStatus = Literal["completed", "interrupted", "error"]


def result_status(subtype: str, is_error: bool, stopped: bool) -> ResultStatus:
    """`stopped`: someone asked the turn to stop (who it was is the caller's to say)."""
    if subtype == CUT_SHORT:
        return "interrupted" if stopped else "error"
    return "error" if is_error else "completed"
