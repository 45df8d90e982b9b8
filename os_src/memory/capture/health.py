"""Capture's health as its two readers see it: /healthz (pipeline.Capture.status, in the server) and
`memory status` (spill.read_status, from another process). Pure but for one directory listing; below
the journal, the spill file and the writer, which all take their names and policy from here.

- `degraded(report)`: the one rule. Each reader fills in what it knows; what it can't know (only the
  server has a queue, acks and a journal in the way) is left out and counts as fine.
- `set_aside_journals`: the turn journals a start could not read and set aside, as they are now.
- `LOCAL_DISK`: how long capture's writes and journal wait after the n-th failure in a row.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...backoff import Backoff

LOCAL_DISK = Backoff(first=0.25, max=5.0)  # a local disk: retry soon and often
# A write queued this long has not landed (a disk that hangs rather than fails): capture is degraded.
STALLED_AFTER = 30.0
JOURNAL_NAME = "turn-journal.json"
UNREADABLE = ".unreadable-"  # a journal a start could not read, set aside: turn-journal.json.unreadable-<time>


def set_aside_journals(state_dir: Path) -> list[Path]:
    """The journals a start could not read and set aside (`turn-journal.json.unreadable-<time>`), as
    the folder holds them now, oldest first: kept until the operator replays or removes them."""
    return sorted(state_dir.glob(f"{JOURNAL_NAME}{UNREADABLE}*"))


def degraded(report: dict[str, Any]) -> bool:
    """Capture is degraded while its writes fail or wait in the spill file, while the oldest write has
    been queued past STALLED_AFTER (a hung disk fails nothing, yet no turn lands), while a turn the
    person was told was not saved is still not durable, or while a turn journal is set aside (or could
    not even be: `journal_stuck`)."""
    return bool(report.get("failing_since") is not None or report.get("spilled")
                or report.get("oldest_queued_s", 0.0) > STALLED_AFTER or report.get("not_saved")
                or report.get("journals_set_aside") or report.get("journal_stuck"))
