"""Capture's health as its two readers see it: /healthz (pipeline.Capture.status, in the server) and
`memory status` (spill.read_status, from another process). Pure but for one directory listing; below
the journal, the spill file and the writer, which all take their names and policy from here.

- `degraded(report)`: the one rule. Each reader fills in what it knows; what it can't know (only the
  server has a queue, acks and a journal in the way) is left out and counts as fine.
- `set_aside_journals`: the turn journals a start could not read and set aside, as they are now.
- `LOCAL_DISK`: how long capture's writes and journal wait after the n-th failure in a row.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ...backoff import Backoff

LOCAL_DISK = Backoff(first=0.25, max=5.0)  # a local disk: retry soon and often
# A write queued this long has not landed (a disk that hangs rather than fails): capture is degraded.
STALLED_AFTER = 30.0
JOURNAL_NAME = "turn-journal.json"
# A journal a start could not read is set aside under a name that says why: turn-journal.json<why><time>.
IO_ERROR = ".io-error-"  # the disk failed to read it: a later read may succeed, so it can be replayed
DAMAGED = ".damaged-"  # a whole line and none that decodes: every start would read the same bytes
EARLIER = ".unreadable-"  # an earlier release's name, for either: a replay is tried as for IO_ERROR (it is safe)
SET_ASIDE = (IO_ERROR, DAMAGED, EARLIER)


def set_aside_name(damaged: bool, stamp: str) -> str:
    return f"{JOURNAL_NAME}{DAMAGED if damaged else IO_ERROR}{stamp}"


def _stamp(name: str) -> str | None:
    """The time part of a set-aside journal's name; None: it is no such name."""
    return next((name[len(JOURNAL_NAME) + len(why):] for why in SET_ASIDE if name.startswith(JOURNAL_NAME + why)),
                None)


def set_aside_journals(state_dir: Path) -> list[Path]:
    """The journals a start could not read and set aside, as the folder holds them now (one directory
    read), oldest first: kept until the operator replays or removes them."""
    try:
        with os.scandir(state_dir) as entries:
            found = [(stamp, Path(e.path)) for e in entries if (stamp := _stamp(e.name)) is not None]
    except FileNotFoundError:
        return []
    return [path for _stamp_, path in sorted(found)]


def is_damaged(name: str) -> bool:
    return name.startswith(JOURNAL_NAME + DAMAGED)


def advice(name: str) -> str:
    """What the operator can do with the set-aside journal `name` (in .os/state/): said by `memory status`
    and the start's log line. Never a rename over a live turn-journal.json: it holds turns of its own."""
    if is_damaged(name):
        return ("no line of it decodes, and a start would only set it aside again: do not rename it back. Keep "
                "it until you have read what it holds: each line is one save, a JSON list of "
                '{"observation": {"session_id", "sequence_num", "user_message", "agent_response", ...}, '
                f'"ended"}}, the last line the newest (`tail -n 1 .os/state/{name}`); then remove it')
    return (f"the disk failed to read it; a later read may not. To replay its turns: stop the server; if "
            f".os/state/{JOURNAL_NAME} is there, start the server and stop it once first (that start records "
            f"it); then `mv -n .os/state/{name} .os/state/{JOURNAL_NAME}` (-n: never over a live one; it does "
            f"nothing, and says nothing, while .os/state/{JOURNAL_NAME} is there: check that .os/state/{name} is gone) "
            "and start the server")


def degraded(report: dict[str, Any]) -> bool:
    """Capture is degraded while its writes fail or wait in the spill file, while the oldest write has
    been queued past STALLED_AFTER (a hung disk fails nothing, yet no turn lands), while a turn the
    person was told was not saved is still not durable, or while a turn journal is set aside (or could
    not even be: `journal_stuck`)."""
    return bool(report.get("failing_since") is not None or report.get("spilled")
                or report.get("oldest_queued_s", 0.0) > STALLED_AFTER or report.get("not_saved")
                or report.get("journals_set_aside") or report.get("journal_stuck"))
