"""`sprite-os`: serve, chat, and the operator's memory commands.

    sprite-os [serve] [--workspace W] [--host H] [--port P]
    sprite-os dev [--workspace W] [--host H] [--port P]
    sprite-os chat [--url ws://HOST:PORT] [--workspace W]
    sprite-os memory status [--json]
    sprite-os memory search QUERY [--limit N]
    sprite-os memory rebuild --yes
    sprite-os memory history FILE
    sprite-os memory show FILE [VERSION]
    sprite-os memory rollback FILE VERSION
    sprite-os service start|stop|restart|status
    sprite-os migrate-v1

Settings come from the environment (see config.py); flags override them.
A bad setting fails at once with one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import __version__
from .config import Settings, load_settings
from .errors import ConfigError, SpriteOSError, UsageError

COMMANDS = ("serve", "dev", "chat", "memory", "service", "migrate-v1", "install-templates", "version")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sprite-os", description="Sprite OS: a user's agent, with memory.")
    parser.add_argument("--workspace", help="workspace root (env SPRITE_WORKSPACE, default /workspace)")
    sub = parser.add_subparsers(dest="command")

    serve = sub.add_parser("serve", help="serve the agent on a WebSocket port (the default command)")
    serve.add_argument("--host", help="address to listen on (env SPRITE_OS_HOST)")
    serve.add_argument("--port", type=int, help="port to listen on (env SPRITE_OS_PORT, default 8765)")
    serve.add_argument("--log-format", choices=("kv", "json"), help="env SPRITE_LOG_FORMAT")
    serve.add_argument("--log-file", help="env SPRITE_LOG_FILE; rotated at 10 MB")

    dev = sub.add_parser("dev", help="serve a local workspace (default ./.workspace) with the demo model, as `make run` does")
    # SUPPRESS: without the flag here, `sprite-os --workspace W dev` keeps W.
    dev.add_argument("--workspace", default=argparse.SUPPRESS, help="env SPRITE_WORKSPACE, default ./.workspace")
    dev.add_argument("--host", help="address to listen on (env SPRITE_OS_HOST)")
    dev.add_argument("--port", type=int, help="port to listen on (env SPRITE_OS_PORT, default 8765)")

    chat = sub.add_parser("chat", help="talk to a running server from the terminal")
    chat.add_argument("--url", help="server URL (default ws://127.0.0.1:<SPRITE_OS_PORT>)")

    memory = sub.add_parser("memory", help="inspect and repair the memory of a workspace")
    msub = memory.add_subparsers(dest="memory_command", required=True)
    status = msub.add_parser("status", help="batches, pending and stale turns, failures, tokens and cost")
    status.add_argument("--json", action="store_true")
    search = msub.add_parser("search", help="search learnings as the agent's search_memory does")
    search.add_argument("query")
    search.add_argument("--limit", type=int, default=10)
    rebuild = msub.add_parser("rebuild", help="rebuild memory.db and the curated files from transcript.db")
    rebuild.add_argument("--yes", action="store_true", help="confirm: the server must be stopped")
    history = msub.add_parser("history", help="list every version of a memory file")
    history.add_argument("file")
    show = msub.add_parser("show", help="print a memory file, or one of its versions")
    show.add_argument("file")
    show.add_argument("version", type=int, nargs="?")
    rollback = msub.add_parser("rollback", help="make an earlier version of a memory file current")
    rollback.add_argument("file")
    rollback.add_argument("version", type=int)

    service = sub.add_parser("service", help="run the server in the background on a Sprite")
    service.add_argument("action", choices=("start", "stop", "restart", "status"))

    sub.add_parser("migrate-v1", help="move a v1 workspace (agent.db, memory/*.md) into .os/")
    templates = sub.add_parser("install-templates", help="(deploys) install a release's memory file templates")
    templates.add_argument("directory", help="the release's bootstrap/templates")
    templates.add_argument("--source", default="deploy", help="how the versions are labelled in history")
    sub.add_parser("version", help="print the version")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # `sprite-os --port 9000` means `sprite-os serve --port 9000`.
    if not any(a in COMMANDS for a in argv) and not any(a in ("-h", "--help") for a in argv):
        argv = ["serve", *argv] if not argv or argv[0].startswith("-") else argv
    args = _parser().parse_args(argv)
    try:
        log_file = getattr(args, "log_file", None)
        settings = load_settings(_environment(args.command)).with_overrides(
            workspace=Path(args.workspace) if args.workspace else None, host=getattr(args, "host", None),
            port=getattr(args, "port", None), log_format=getattr(args, "log_format", None),
            log_file=Path(log_file) if log_file else None,
        )
        return _run(args, settings)
    except SpriteOSError as exc:
        print(f"sprite-os: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


def _environment(command: str | None) -> dict[str, str] | None:
    """The environment settings are read from: dev mode puts its own defaults under it."""
    if command != "dev":
        return None
    from .dev.command import dev_environment

    return dev_environment(os.environ)


def _run(args: argparse.Namespace, settings: Settings) -> int:
    match args.command:
        case "serve" | None:
            from .server import serve_main

            return serve_main(settings)
        case "dev":
            from .dev.command import dev_main

            return dev_main(settings)
        case "chat":
            from .chat import chat_main

            return chat_main(settings, args.url)
        case "memory":
            return _memory(args, settings)
        case "service":
            from .supervisor import service_main

            return service_main(settings, args.action)
        case "migrate-v1":
            from .migrate import migrate_main

            return migrate_main(settings)
        case "install-templates":
            return _install_templates(settings, Path(args.directory), args.source)
        case "version":
            print(__version__)
            return 0
    return 2


def _install_templates(settings: Settings, directory: Path, source: str) -> int:
    from .memory.files import install_templates

    written = install_templates(settings.layout, directory, source)
    print(f"templates: written={','.join(written) or 'none'}")
    return 0


# ---------------------------------------------------------------- memory commands


def _when(ts: float | None, seconds: bool = False) -> str:
    return time.strftime(f"%Y-%m-%d %H:%M{':%S' if seconds else ''} UTC", time.gmtime(ts)) if ts else "never"


def _memory(args: argparse.Namespace, settings: Settings) -> int:
    from .memory.files import SPECS, MemoryFiles
    from .memory.memory_store import MemoryDB
    from .memory.transcript_store import TranscriptDB

    layout = settings.layout
    if not layout.memory_dir.is_dir():
        raise ConfigError(f"no memory at {layout.memory_dir}: is SPRITE_WORKSPACE right?")
    files = MemoryFiles(layout)
    command = args.memory_command
    if command in ("history", "show", "rollback") and args.file not in SPECS:
        raise UsageError(f"unknown memory file {args.file!r}; choose one of {', '.join(SPECS)}")

    if command == "status":
        transcript, memory = TranscriptDB(layout.transcript_db), MemoryDB(layout.memory_db)
        report = _status(transcript, memory, files, settings.memory_daily_budget_usd)
        from .memory.capture_spill import read_status

        report["capture"] = read_status(layout)  # what /healthz shows about capture's writes
        if args.json:
            print(json.dumps(report, indent=2))
        else:
            _print_status(report, layout.root)
        return 0
    if command == "search":
        from .memory.search import clamp_limit, search_learnings, search_terms
        from .tools.memory_search import render

        terms = search_terms(args.query)
        hits = search_learnings(MemoryDB(layout.memory_db), terms, clamp_limit(args.limit)) if terms else []
        print(render(args.query, hits))
        return 0
    if command == "rebuild":
        if not args.yes:
            raise UsageError("rebuild replaces memory.db and the curated files; stop the server and pass --yes")
        from .memory.rebuild import rebuild

        rebuilt = asyncio.run(rebuild(settings))
        print(f"rebuilt from {rebuilt.observations} turns in {rebuilt.batches} batches: "
              f"{rebuilt.learnings} learnings, ${rebuilt.cost_usd:.4f}")
        if rebuilt.backup:
            print(f"the previous memory.db is kept at {rebuilt.backup}")
        return 0
    if command == "history":
        versions = files.history(args.file)
        if not versions:
            print(f"{args.file} has no saved versions yet")
        for v in versions:
            text = v.text
            print(f"{v.number:>5}  {_when(v.created_at)}  {v.source:<22} {text.count(chr(10)):>4} lines")
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
        try:
            version = files.rollback(args.file, args.version)
        except KeyError as exc:
            raise UsageError(str(exc.args[0])) from None
        print(f"{args.file} is now version {args.version}'s text (saved as version {version.number})")
        return 0
    return 2


def _status(transcript: Any, memory: Any, files: Any, daily_usd: float) -> dict[str, Any]:
    from .memory.budget import BUDGET_KEY, BudgetRecord, DailyBudget, day_start
    from .memory.files import SPECS
    from .memory.retry import FAILING_KEY, FailureClock

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
        "files": {name: {"lines": files.read(name).count("\n"), "limit": spec.max_lines,
                         "versions": len(files.history(name))} for name, spec in SPECS.items()},
    }


def _print_status(r: dict[str, Any], root: Any) -> None:
    o, t = r["observations"], r["totals"]
    print(f"Memory of {root}")
    print(f"  turns recorded   {o['total']}: {o['processed']} processed, {o['pending']} pending, {o['stale']} stale")
    if o["pending"]:
        print(f"  oldest pending   {_when(r['oldest_pending_at'])}")
    if b := r["last_batch"]:
        print(f"  last batch       #{b['id']} {_when(b['at'])}, {b['status']} ({b['trigger']}), "
              f"{b['turns']} turns, {b['learnings']} new learnings")
    else:
        print("  last batch       none yet")
    print(f"  batches          {t['batches']} ({t['failed_batches']} failed calls)")
    print(f"  tokens           {t['input_tokens']:,} in, {t['output_tokens']:,} out; cost ${t['cost_usd']:.4f}")
    if f := r["last_failure"]:
        print(f"  last failure     {_when(f['at'])}: {(f['error'] or '')[:160]}")
    if (failing := r["failing"])["failing_since"] is not None:
        n = failing["consecutive_failures"]
        print(f"  failing          since {_when(failing['failing_since'])}, {n} failed call{'' if n == 1 else 's'} "
              f"in a row{' (degraded)' if failing['degraded'] else ''}; next retry {_when(failing['next_retry_at'], seconds=True)}")
    if (capture := r["capture"])["degraded"]:
        since = f"failing since {_when(capture['failing_since'])}, {capture['consecutive_failures']} failed writes in a " \
                f"row ({(capture['last_error'] or '')[:100]}); " if capture["failing_since"] else ""
        print(f"  capture          degraded: {since}{capture['spilled']} writes waiting in the spill file")
    budget = r["budget"]
    print(f"  budget           ${budget['spent_today_usd']:.4f} of ${budget['daily_usd']:.2f} spent today (UTC)"
          + (f"; spent: batches wait until {_when(budget['resumes_at'])}" if budget["waiting"] else ""))
    print(f"  learnings        {t['learnings']}; pending actions {t['pending_actions']}")
    for name, info in r["files"].items():
        print(f"  {name:<16} {info['lines']:>4}/{info['limit']} lines, {info['versions']} version{'' if info['versions'] == 1 else 's'}")
