"""The audit of what a person changed in memory: every forgetting, undo, edit and rollback is a row in
`memory_audit` (never more than DETAIL_CHARS of what it was about)."""

from __future__ import annotations

from typing import Literal

import msgspec

from ..database import rows
from .memory_store import MemoryDB

AuditAction = Literal["forget", "unforget", "edit", "rollback", "forget_turns"]
DETAIL_CHARS = 200


class AuditRow(msgspec.Struct, frozen=True):
    id: int
    at: float
    action: AuditAction
    learning_id: int | None
    file: str | None
    detail: str


def record(db: MemoryDB, action: AuditAction, now: float, *, learning_id: int | None = None,
           file: str | None = None, detail: str = "") -> None:
    db.conn.execute("INSERT INTO memory_audit (at, action, learning_id, file, detail) VALUES (?, ?, ?, ?, ?)",
                    (now, action, learning_id, file, detail[:DETAIL_CHARS]))


def audit(db: MemoryDB, limit: int) -> list[AuditRow]:
    return rows(db.conn.execute("SELECT id, at, action, learning_id, file, detail FROM memory_audit "
                                "ORDER BY id DESC LIMIT ?", (limit,)), AuditRow)
