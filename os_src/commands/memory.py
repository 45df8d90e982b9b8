"""The operator's memory commands: `sprite-os memory status|search|recall|import|rebuild|history|show|rollback`.

    sprite-os memory status [--json]
    sprite-os memory search QUERY [--json] [--limit N] [--lexical]
    sprite-os memory search - --json          # one query a line on stdin, one JSON line out each
    sprite-os memory recall MESSAGE [--json] [--session ID] [--lexical]   # what auto-recall would send
    sprite-os memory recall - --json          # one message a line on stdin
    sprite-os memory import FILE.jsonl
    sprite-os memory rebuild --yes [--index] [--even-if-forgotten-unreadable]
    sprite-os memory history FILE
    sprite-os memory show FILE [VERSION]
    sprite-os memory rollback FILE VERSION

Search, recall, status, history and show only read, so they work while the server runs; import
hands its turns to the workspace's one writer (the running server, or itself under the writer lock:
see memory_import.py); rebuild and rollback need the server stopped (a rollback writes under the
writer lock; the console's rollback goes through the running server).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config import Settings
from ..errors import ConfigError, SpriteOSError, UsageError

if TYPE_CHECKING:
    from ..memory.files import MemoryFiles, Version

# `memory rebuild`'s flag that goes on when a memory.db it must read can't be read: spelled here alone
REBUILD_ANYWAY = "--even-if-forgotten-unreadable"


def add_memory_parser(sub: Any) -> None:
    memory = sub.add_parser("memory", help="inspect, search and repair the memory of a workspace")
    msub = memory.add_subparsers(dest="memory_command", required=True)
    st = msub.add_parser("status", help="batches, pending and stale turns, failures, tokens, cost, recall")
    st.add_argument("--json", action="store_true")
    search = msub.add_parser("search", help="search past turns and learnings as the agent's search_memory does")
    search.add_argument("query", help="what to look for; `-` reads one query a line from stdin (with --json)")
    search.add_argument("--limit", type=int, default=10)
    search.add_argument("--json", action="store_true", help="hits as JSON: kind, score, date, source ids, snippet")
    search.add_argument("--lexical", action="store_true", help="rank by words only (no embedding model)")
    recall = msub.add_parser("recall", help="what auto-recall would send with a message: the block and its memories")
    recall.add_argument("message", help="the person's message; `-` reads one a line from stdin (with --json)")
    recall.add_argument("--json", action="store_true", help="{message, enabled, block, tokens, hits} as JSON")
    recall.add_argument("--session", help="the session the message is in: its own turns are not recalled")
    recall.add_argument("--lexical", action="store_true", help="rank by words only (no embedding model)")
    imp = msub.add_parser("import", help="bring past conversations in: one turn a JSON line")
    imp.add_argument("file", help='JSONL: {"session", "timestamp", "user", "assistant"?, "tool_calls"?} a line')
    rebuild = msub.add_parser("rebuild", help="rebuild memory.db, the curated files and recall from transcript.db")
    rebuild.add_argument("--yes", action="store_true", help="confirm: the server must be stopped")
    rebuild.add_argument("--index", action="store_true",
                         help="only the searchable turns, the recall index and embeddings: no curator call")
    rebuild.add_argument(REBUILD_ANYWAY, dest="rebuild_anyway", action="store_true",
                         help="rebuild even when memory.db (or the copy an unfinished rebuild set aside) can't be "
                              "read: learnings forgotten in it come back, and a forget not finished in it is lost "
                              "(its turns curated again); with a readable one, it changes nothing")
    history = msub.add_parser("history", help="list every version of a memory file")
    history.add_argument("file")
    show = msub.add_parser("show", help="print a memory file, or one of its versions")
    show.add_argument("file")
    show.add_argument("version", type=int, nargs="?")
    rollback = msub.add_parser("rollback", help="make an earlier version of a memory file current; the server "
                               "must be stopped (while it runs, roll back from the console)")
    rollback.add_argument("file")
    rollback.add_argument("version", type=int)


def memory_main(args: argparse.Namespace, settings: Settings) -> int:
    from ..memory.files import SPECS

    layout = settings.layout
    if args.memory_command == "import":  # makes the memory folder of a workspace that never served
        from .memory_import import import_main

        return import_main(settings, Path(args.file))
    if not layout.memory_dir.is_dir():
        raise ConfigError(f"no memory at {layout.memory_dir}: is SPRITE_WORKSPACE right?")
    command = args.memory_command
    if command in ("history", "show", "rollback") and args.file not in SPECS:
        raise UsageError(f"unknown memory file {args.file!r}; choose one of {', '.join(SPECS)}")
    if command in ("status", "search", "recall"):
        return _reading(args, settings)
    if command == "rebuild":
        return _rebuild(args, settings)
    return _files(args, settings)


def _reading(args: argparse.Namespace, settings: Settings) -> int:
    """status, search, recall: what the databases hold. One they can't open or read (a disk gone
    read-only, a file that is not a database) is one line naming the folder, exit 1, not a traceback."""
    import sqlite3

    try:
        if args.memory_command == "status":
            return _status(args, settings)
        if args.memory_command == "search":
            from .memory_search import search_main

            return search_main(settings, args.query, args.limit, args.json, args.lexical)
        from .memory_search import recall_main

        return recall_main(settings, args.message, args.json, args.lexical, args.session)
    except sqlite3.Error as exc:
        folder = settings.layout.memory_dir
        hint = "" if os.access(folder, os.W_OK) else ("; its folder can't be written (a read-only disk?), which "
                                                      "opening them in write-ahead mode needs")
        raise SpriteOSError(f"cannot read the memory databases in {folder}: {exc}{hint}") from None


def _status(args: argparse.Namespace, settings: Settings) -> int:
    from ..memory.files import MemoryFiles
    from ..memory.memory_store import MemoryDB
    from ..memory.transcript_store import TranscriptDB
    from .memory_status import (
        ask_server,
        disk,
        print_recall,
        print_status,
        recall_status,
        server_forget,
        status,
    )

    layout = settings.layout
    transcript, memory = TranscriptDB(layout.transcript_db, reading=True), MemoryDB(layout.memory_db, reading=True)
    report = status(transcript, memory, MemoryFiles(layout), settings.memory_daily_budget_usd)
    asked = ask_server(settings)  # the running server's /healthz, once, for what only it knows
    report["recall"] = recall_status(settings, memory, transcript, asked)
    report["server_forget"] = server_forget(asked)
    from ..memory.capture.spill import read_status

    report["capture"] = read_status(layout)  # what /healthz shows about capture's writes
    report["disk"] = disk(layout.memory_dir)
    from ..isolation.probe import read_mode

    report["isolation"] = read_mode(layout)  # as the server chose it at its last start
    from ..agent.spend_book import SPEND_FILE, status_report

    report["agent_budget"] = status_report(layout.state_dir / SPEND_FILE, time.time())  # as the relay keeps it
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_status(report, layout.root)
        print_recall(report["recall"])
    return 0


def _progress(what: str, done: int, of: int) -> None:
    print(f"  {what}: {done:,} of {of:,}", file=sys.stderr, flush=True)


def _rebuild(args: argparse.Namespace, settings: Settings) -> int:
    if not args.yes:
        what = "the recall index" if args.index else "memory.db and the curated files"
        raise UsageError(f"rebuild replaces {what}; stop the server and pass --yes")
    from ..errors import LockHeld
    from ..fsutil import WriterLock
    from ..memory.recall.rebuild import rebuild_recall

    before = None  # the memory.db set aside whose vectors, and which turn each was made after, recall keeps
    if not args.index:
        import asyncio  # here, not at the top: every command builds this module's parser, and most never need it

        from ..memory.curation.rebuild import MemoryDbUnreadable, rebuild

        try:
            rebuilt = asyncio.run(rebuild(settings, forgotten_unreadable_ok=args.rebuild_anyway))
        except MemoryDbUnreadable as exc:
            raise SpriteOSError(f"{exc}, or pass {REBUILD_ANYWAY} to rebuild anyway (learnings forgotten in it "
                                "come back, and a forget not finished in it is lost, its turns curated again)") from None
        print(f"rebuilt from {rebuilt.observations} turns in {rebuilt.batches} batches: "
              f"{rebuilt.learnings} learnings, ${rebuilt.cost_usd:.4f}")
        if rebuilt.forgets:
            print(f"{rebuilt.forgets} forget{'s' if rebuilt.forgets != 1 else ''} not finished carried over: their "
                  "turns were left out, and the server's next start finishes them")
        if rebuilt.before is not None and rebuilt.before != rebuilt.backup:  # after a rebuild cut short
            print(f"the memory.db from before the rebuild that did not finish is kept at {rebuilt.before}")
            if rebuilt.backup:
                print(f"the half-made one it left is kept at {rebuilt.backup}")
        elif rebuilt.backup:
            print(f"the previous memory.db is kept at {rebuilt.backup}")
        before = rebuilt.before
    lock = WriterLock(settings.layout.memory_lock, WriterLock.REBUILD)
    try:
        lock.acquire()
    except LockHeld as exc:
        raise LockHeld(f"{exc}: stop the server before rebuilding") from None
    try:
        recall = rebuild_recall(settings, _progress, before)
    finally:
        lock.release()
    print(f"recall rebuilt in {recall.seconds:.1f} s: {recall.episodes} turns and {recall.documents} documents "
          f"indexed; {recall.vectors} turns embedded ({recall.embedded} now) by {recall.dense}")
    if recall.warning:
        print(f"warning: {recall.warning}", file=sys.stderr)
    return 0


def _files(args: argparse.Namespace, settings: Settings) -> int:
    from ..memory.files import MemoryFiles
    from .memory_status import when

    files, command = MemoryFiles(settings.layout), args.memory_command
    if command == "history":
        versions = files.history(args.file)
        if not versions:
            print(f"{args.file} has no saved versions yet")
        for v in versions:
            print(f"{v.number:>5}  {when(v.created_at)}  {v.source:<22} {v.text.count(chr(10)):>4} lines")
        return 0
    if command == "show":
        if args.version is None:
            sys.stdout.write(files.read(args.file))
            return 0
        for v in files.history(args.file):
            if v.number == args.version:
                sys.stdout.write(v.text)
                return 0
        raise UsageError(f"{args.file} has no version {args.version}")
    if command == "rollback":
        version = _rollback(settings, files, args.file, args.version)
        print(f"{args.file} is now version {args.version}'s text (saved as version {version.number})")
        return 0
    return 2


def _rollback(settings: Settings, files: MemoryFiles, name: str, number: int) -> Version:
    """The rollback's write, holding the workspace's writer lock: a server starting meanwhile sweeps the
    memory folder's temp files under it, and would remove this write's mid-way. A server that holds it
    (running, or starting) refuses the command: the console rolls a file back through the server."""
    from ..errors import LockHeld
    from ..fsutil import WriterLock

    lock = WriterLock(settings.layout.memory_lock, WriterLock.ROLLBACK)
    try:
        lock.acquire()
    except LockHeld as exc:
        holder = lock.holder()
        if holder is not None and holder.role not in (WriterLock.SERVER, None):
            raise LockHeld(f"{exc}: run the rollback again once that command has finished") from None
        raise LockHeld(f"{exc}: while the server runs, make the version current from the console (Memory, the "
                       "file's versions), or stop the server first (sprite-os service stop)") from None
    try:
        return files.rollback(name, number)
    except KeyError as exc:
        raise UsageError(str(exc.args[0])) from None
    finally:
        lock.release()
