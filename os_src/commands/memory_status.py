"""`sprite-os memory status`: what memory holds, what the daemon did, what it cost, and how recall is doing."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any

from ..fsutil import Holder, free_bytes
from ..memory.capture.health import advice, is_damaged
from ..memory.import_inbox import (
    INBOX,
    SET_ASIDE_ENDING,
    SET_ASIDE_SUFFIX,
    count,
    inbox_files,
    read_progress,
)
from ..memory.recall import episodes as ep
from ..memory.recall.backlog import unseen
from ..memory.recall.dense import load
from ..memory.recall.documents import read_marks
from ..memory.recall.index import RecallIndex, exists
from ..memory.recall.service import index_path, published, vectors_path
from ..memory.recall.vectors import read_meta
from ..text import utc


def when(ts: float | None, seconds: bool = False) -> str:
    return utc(ts, f"%Y-%m-%d %H:%M{':%S' if seconds else ''} UTC") if ts else "never"


def status(transcript: Any, memory: Any, files: Any, daily_usd: float) -> dict[str, Any]:
    from ..memory.curation.budget import BUDGET_KEY, BudgetRecord
    from ..memory.curation.retry import FAILING_KEY, FailureClock
    from ..memory.files import SPECS
    from ..memory.forget.jobs import waiting
    from ..spending import DailyBudget, day_start

    # The server's budget as it saved it (its environment may not be this shell's), else the setting.
    record = BudgetRecord.loads(memory.get_meta(BUDGET_KEY)) or BudgetRecord(daily_usd)
    now = time.time()
    clock = FailureClock()
    with contextlib.suppress(ValueError):  # unreadable: the daemon starts a fresh clock too
        clock.restore(memory.get_meta(FAILING_KEY))  # saved by the daemon after every failed call
    last = memory.recent_batches(1)
    failures = [b for b in memory.recent_batches(50) if b.status == "failed"]
    return {
        "observations": transcript.counts(),
        "oldest_pending_at": transcript.oldest_pending_timestamp(),
        "totals": memory.totals(),
        "last_batch": None if not last else {
            "id": last[0].id, "at": last[0].created_at, "status": last[0].status, "trigger": last[0].trigger,
            "turns": len(last[0].observation_ids), "learnings": last[0].learnings_added, "error": last[0].error},
        "last_failure": None if not failures else {"at": failures[0].created_at, "error": failures[0].error},
        "last_success_at": memory.last_done_at(),  # as /healthz shows it
        "failing": clock.report(),  # what /healthz shows
        "budget": DailyBudget(record.daily_usd).report(now, memory.cost_since(day_start(now)), record.resumes_at),
        "forgets": waiting(memory)._asdict(),
        "files": {name: {"lines": files.read(name).count("\n"), "limit": spec.max_lines,
                         "versions": len(files.history(name))} for name, spec in SPECS.items()},
    }


# Why the server's forget pass keeps a job (forget/turns.py's KEPT_*), in the console's Health's words
KEPT_BECAUSE = {"disk": "the disk would not rewrite a memory file",
                "index": "the search index's rewrite without the forgotten words keeps failing",
                "check": "the check of which lines came from the forgotten turns keeps failing",
                "reader": "another program keeps memory open",
                "error": "finishing it failed unexpectedly (the server's log says how)"}

DISK_LOW_BYTES = 16 * 1024 * 1024  # below this, capture's writes (a turn is up to ~100 KB) soon fail


def disk(path: Any) -> dict[str, Any]:
    """The free space where memory lives: a full disk stops capture, and the server then can't
    write anything new to say so (its status file is rewritten in place; this is seen directly)."""
    try:
        free = free_bytes(path)
    except OSError as exc:
        return {"free_bytes": None, "low": None, "error": exc.strerror}
    return {"free_bytes": free, "low": free < DISK_LOW_BYTES}


def print_status(r: dict[str, Any], root: Any) -> None:
    o, t = r["observations"], r["totals"]
    print(f"Memory of {root}")
    isolation = r.get("isolation") or {}
    mode = isolation.get("mode", "unknown (the server has not started since it records it)")
    loud = "  -- NOT ISOLATED: the agent's commands can change .os/" if mode == "none" else ""
    print(f"  agent isolation  {mode}{loud}")
    if (agent := r.get("agent_budget")) is not None:
        refused = ", ".join(f"{n} {why}" for why, n in sorted(agent["refused_today"].items()))
        print(f"  agent spending   ${agent['spent_today_usd']:.4f} of ${agent['daily_usd']:.2f} today (UTC), "
              f"{agent['calls_today']} calls" + (f"; refused: {refused}" if refused else ""))
    else:
        print("  agent spending   unknown (the server has not started since it records it)")
    print(f"  turns recorded   {o['total']}: {o['processed']} processed, {o['pending']} pending, {o['stale']} stale")
    if o["pending"]:
        print(f"  oldest pending   {when(r['oldest_pending_at'])}")
    if b := r["last_batch"]:
        print(f"  last batch       #{b['id']} {when(b['at'])}, {b['status']} ({b['trigger']}), "
              f"{b['turns']} turns, {b['learnings']} new learnings")
    else:
        print("  last batch       none yet")
    print(f"  batches          {t['batches']} ({t['failed_batches']} failed calls)")
    print(f"  tokens           {t['input_tokens']:,} in, {t['output_tokens']:,} out; cost ${t['cost_usd']:.4f}")
    for i, said in enumerate(left_out(t)):  # its label on the first line only
        print(f"  {'' if i else 'left out':<16} {said}")
    if f := r["last_failure"]:
        print(f"  last failure     {when(f['at'])}: {(f['error'] or '')[:160]}")
    if (failing := r["failing"])["failing_since"] is not None:
        n = failing["consecutive_failures"]
        print(f"  failing          since {when(failing['failing_since'])}, {n} failed call{'' if n == 1 else 's'} "
              f"in a row{' (degraded)' if failing['degraded'] else ''}; next retry {when(failing['next_retry_at'], seconds=True)}")
    if (capture := r["capture"])["failing_since"] or capture["spilled"]:
        since = f"failing since {when(capture['failing_since'])}, {capture['consecutive_failures']} failed writes in a " \
                f"row ({(capture['last_error'] or '')[:100]}); " if capture["failing_since"] else ""
        print(f"  capture          degraded: {since}{capture['spilled']} writes waiting in the spill file")
    for name in capture.get("journals_set_aside") or []:
        print(f"  turn journal     {'DAMAGED' if is_damaged(name) else 'UNREAD'}: a start could not read it and set it "
              f"aside as .os/state/{name}; its turns are not recorded: {advice(name)}")
    if (space := r.get("disk") or {}).get("low"):
        print(f"  disk             FULL: {space['free_bytes'] // 1024:,} KiB free where memory lives; "
              "turns wait in the server's memory until space is freed")
    forget_said: dict[str, Any] = r.get("server_forget") or {}  # the running server's word on its forget pass (`server_forget`)
    if (forgets := r["forgets"])["jobs_waiting"]:
        print(f"  forgets          {forgets['jobs_waiting']} waiting for the daemon's pass to take their lines out of the memory files, the "
              f"oldest since {when(forgets['oldest_job_at'])} (the boot prompt leaves those lines out meanwhile); a pass "
              "normally takes seconds: if this stays, see /healthz's memory.forget and the server's log"
              + (f"; the server keeps them: {KEPT_BECAUSE.get(why, why)}" if (why := forget_said.get("kept_why")) else ""))
    for path in forget_said.get("unreadable_backups") or []:
        print(f"  forget backup    UNREADABLE: .os/{path} is no database sqlite can rewrite, and may hold forgotten "
              "words: remove it (the server names it until it is gone)")
    budget = r["budget"]
    print(f"  budget           ${budget['spent_today_usd']:.4f} of ${budget['daily_usd']:.2f} spent today (UTC)"
          + (f"; spent: batches wait until {when(budget['resumes_at'])}" if budget["waiting"] else ""))
    print(f"  learnings        {t['learnings']}; pending actions {t['pending_actions']}")
    for name, info in r["files"].items():
        print(f"  {name:<16} {info['lines']:>4}/{info['limit']} lines, {info['versions']} version{'' if info['versions'] == 1 else 's'}")


def left_out(t: dict[str, Any]) -> list[str]:
    """What the curator's replies said that memory did not keep, in all, in words, a line each; nothing when
    none was."""
    said = []
    if n := t["learnings_over_bound"]:
        said.append(f"{n:,} learning{'' if n == 1 else 's'} past what one curator call may keep, dropped (their "
                    "turns are marked curated all the same)")
    if n := t["lines_ignored"]:
        said.append(f"{n:,} line{'' if n == 1 else 's'} of curator replies that followed no rule of the format, "
                    "ignored")
    if n := t["files_rejected"]:
        said.append(f"{n:,} memory file rewrite{'' if n == 1 else 's'} curator replies gave, not applied (given "
                    "twice, empty, cut off, over its limit, or of a file the curator may not write)")
    return said


def recall_status(settings: Any, memory: Any, transcript: Any, asked: Asked | None) -> dict[str, Any]:
    """The turns, the index, the vectors and any import under way, as this process finds them (the model
    is loaded to see that it loads: a model that cannot means lexical-only search, here and in the
    server), with the server's own progress when it published it lately (rate, time left). `asked`: the
    running server's /healthz (`ask_server`), for an import's failure its report could not say."""
    layout = settings.layout
    path = index_path(layout.memory_dir)
    documents = None
    if exists(path):
        with contextlib.suppress(Exception):
            documents = RecallIndex(path).documents
    turns = transcript.counts()["total"]
    waiting = unseen(read_marks(memory.conn).seen(), transcript.max_id()) if documents is not None else turns
    dense, info = load(settings.embedding_model) if settings.recall_dense_weight > 0 else (None, None)
    meta = read_meta(vectors_path(layout.memory_dir, info.model)) if info and info.model else None
    embedded = meta.count if meta else 0
    server = published(layout)
    return {"turns": turns, "episodes": ep.count(memory.conn), "turns_waiting_for_index": waiting,
            "index": str(path), "index_documents": documents,
            "dense": {"available": dense is not None, "model": info.model if info else None,
                      "detail": info.detail if info else "switched off (SPRITE_RECALL_DENSE_WEIGHT=0)",
                      "embedded": embedded, "waiting": max(0, turns - embedded),
                      "per_second": (server.get("embedding") or {}).get("per_second") if server else None},
            "imports": (found := imports(layout)),
            "server_import": server_import(asked) if any(not i["set_aside"] for i in found) else None,
            "auto_recall": settings.auto_recall}


def imports(layout: Any) -> list[dict[str, Any]]:
    """Inbox files waiting for the writer, and those it gave up on (`set_aside`), with what it reported."""
    out = []
    for path in [*inbox_files(layout), *inbox_files(layout, SET_ASIDE_ENDING)]:
        p = read_progress(path)
        out.append({"file": path.name, "turns": p.turns if p else count(path), "applied": p.applied if p else 0,
                    "added": p.added if p else 0, "already": p.already if p else 0, "error": p.error if p else None,
                    "set_aside": path.name.endswith(SET_ASIDE_SUFFIX)})
    return out


@dataclass(frozen=True)
class Asked:
    """The workspace's writer-lock holder, a server or a process that named nobody, and what /healthz on the
    configured port answered (`body`; None: no answer), `by` the pid that answer gave."""

    holder: Any
    port: int
    body: dict[str, Any] | None
    by: Any

    @property
    def answered(self) -> bool:
        """The holder itself answered: the configured port may be another workspace's server."""
        return self.body is not None and self.by == self.holder.pid

    def memory(self, part: str) -> dict[str, Any]:
        """The holder's own `memory.<part>` in /healthz ({} from another process, or none, or one of another shape:
        garbage from the holder itself failed memory status with a traceback)."""
        memory = (self.body or {}).get("memory") if self.answered else None
        said = memory.get(part) if isinstance(memory, dict) else None
        return said if isinstance(said, dict) else {}


def ask_server(settings: Any) -> Asked | None:
    """The running server's /healthz, for what memory's files on disk may not say: on a full disk the report of
    an import's failed attempt fails too, and what waits for the operator in the forget pass (a backup it could
    not read) is the server's alone. Asked only while the writer lock is held by a server, or by a process that
    named nobody (a server that started on a full disk could not write its note), as a look that never takes the
    lock; for 2 s at most. None: no such holder."""
    from ..errors import ConfigError
    from ..fsutil import WriterLock
    from .service import Service

    holder = WriterLock(settings.layout.memory_lock, WriterLock.SERVER).holder()  # a look: never takes it
    if holder is None or holder.role not in (WriterLock.SERVER, None):
        return None
    service, body, port = Service(settings), None, settings.port
    with contextlib.suppress(ConfigError):  # a setting the service would refuse: nobody to ask
        child = service.child_settings()
        port, body = child.port, service.health(child, timeout=2.0)
    return Asked(holder, port, body, (body or {}).get("pid"))


def server_import(asked: Asked | None) -> dict[str, Any] | None:
    """The running server's own word on its import inbox (/healthz's `memory.recall.import`). Its answer counts
    only from that very process (/healthz's `pid`). None: no such holder. `answered`: the holder answered;
    `answered_by`: the pid a server on the port gave."""
    if asked is None:
        return None
    by = asked.by
    return {"holder": {"pid": asked.holder.pid, "role": asked.holder.role}, "port": asked.port,
            "answered": asked.answered, "answered_by": by if isinstance(by, int) else None,
            "import": asked.memory("recall").get("import")}


def server_forget(asked: Asked | None) -> dict[str, Any] | None:
    """The running server's own word on its forget pass (/healthz's `memory.forget`): the backups it could not
    read as databases (`unreadable_backups`, paths under .os/, until the operator removes them) and why it keeps
    a job (`kept_why`). None: no server answered as the holder."""
    if asked is None or not asked.answered:
        return None
    forget = asked.memory("forget")
    backups, why = forget.get("unreadable_backups"), forget.get("kept_why")
    return {"unreadable_backups": [p for p in backups if isinstance(p, str)] if isinstance(backups, list) else [],
            "kept_why": why if isinstance(why, str) else None}


def print_recall(r: dict[str, Any]) -> None:
    dense = r["dense"]
    docs = "missing: start the server or run `memory rebuild --index`" if r["index_documents"] is None \
        else f"{r['index_documents']:,} documents"
    behind = f" ({r['turns_waiting_for_index']:,} waiting to be indexed)" if r["turns_waiting_for_index"] else ""
    print(f"  recall           {r['turns'] - r['turns_waiting_for_index']:,} of {r['turns']:,} turns searchable"
          f"{behind}; index {docs}")
    if dense["available"]:
        rate = f", embedding {dense['per_second']:.1f} a second (about {_duration(dense['waiting'] / dense['per_second'])} "\
               "left)" if dense["waiting"] and dense["per_second"] else ""
        wait = f"; {dense['waiting']:,} waiting, newest first{rate}" if dense["waiting"] else ""
        print(f"  meaning          {dense['model']}: {dense['embedded']:,} of {r['turns']:,} turns embedded{wait}")
    else:
        print(f"  meaning          unavailable, search is lexical only: {dense['detail']}")
    for i in r["imports"]:
        if i.get("set_aside"):
            print(f"  import           FAILED: the server gave up on .os/state/{INBOX}/{i['file']} after its attempts "
                  f"kept failing ({i['error'] or 'no report'}), {i['applied']:,} of {i['turns']:,} turns recorded; "
                  f"rename it back to {i['file'].removesuffix(SET_ASIDE_SUFFIX)} to apply it again, or remove it")
            continue
        state = f"the writer has applied {i['applied']:,} ({i['added']:,} new)" if i["applied"] \
            else "waiting for the workspace's writer (the server)"
        print(f"  import           {i['file']}: {i['turns']:,} turns, {state}"
              + (f"; failing: {i['error']}" if i["error"] else ""))
    if (server := r.get("server_import")) is not None:
        said, holder = server["import"] or {}, server["holder"]
        who = Holder(**holder).describe()
        unseen = "an attempt that failed without its report written (a full disk) is not shown above"
        if server["answered_by"] is not None and not server["answered"]:
            print(f"  import           {who} holds the workspace, but the server on port {server['port']} is "
                  f"another (pid {server['answered_by']}), another workspace's: {unseen}")
        elif not server["answered"]:
            print(f"  import           {who} holds the workspace but /healthz on port {server['port']} did not answer "
                  f"as it (no answer, or none that names the process): {unseen}")
        elif said.get("failing") and said["error"] not in {i["error"] for i in r["imports"]}:  # failing now
            print(f"  import           FAILING, as the server says ({said['failing']} attempts in a row; its "
                  f"report could not be written): {said['error']}")
    print(f"  auto-recall      {'on' if r['auto_recall'] else 'off'}")


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
