"""`make chaos`: the fault-injection suite. It drives the real server (`python -m
sprite_os serve`, a child process) and the real Claude Code CLI against the mock Bridge
through one long conversation, each turn with a unique marker, and acts on them: kill -9
at chosen moments and right after the client reads turn_complete, a flapping proxy, a
freeze, a full disk, a locked database, a slow disk, a power cut, an I/O error that
remounts the workspace read-only, a second server on a deployed workspace, a five-minute
proxy outage, a long run. After each scenario it counts what was lost, duplicated or
corrupted, and what missed the scenario's own bounds; it exits 1 if anything did.

    python -m chaos [--only NAME ...] [--seed N] [--freeze-seconds S] [--lock-seconds S]
                    [--long-turns N] [--ack-kills N] [--power-cuts N] [--outage-seconds S]
                    [--smoke] [--update-docs [--from-results]]

Results go to chaos/results/latest.json; --update-docs rewrites the figures table in
docs/reliability.md (between its `chaos:results` markers). The full disk, the slow disk,
the power cut, the I/O error and the second server need root (and FUSE, a loop device);
elsewhere each says why it skipped.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from chaos.run import Result, run, short
from chaos.scenarios import SCENARIOS, Plan
from devkit.docs_table import rewrite_between
from devkit.host import HostLedger, own_home

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "chaos" / "results"
DOCS = ROOT / "docs" / "reliability.md"


def _machine() -> str:
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return f"{os.cpu_count()} cores, {platform.machine()}, load average {load} at the start"


def table(doc: dict[str, Any]) -> str:
    meta = doc["_meta"]
    reran = "".join(f" {name} was run again alone, on {day}." for name, day in meta.get("reran", {}).items())
    lines = [f"Measured {meta['date']} on {meta['machine']} (--seed={meta['seed']}, {meta['seconds'] / 60:.0f} min).{reran}",
             "", "| scenario | turns | lost / duplicated | curated once | integrity | files, debris, orphans | figures |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in doc["scenarios"]:
        inv = r["invariants"]
        if r.get("skipped"):
            lines.append(f"| {r['name']} | skipped: {r['skipped']} | | | | | |")
            continue
        if inv is None:
            lines.append(f"| {r['name']} | {r['turns']} | not checked | | | | {r['error']} |")
            continue
        t = inv["turns"]
        files = "ok" if not inv["bad_files"] else "**bad**"
        figures = "; ".join(f"{k} {short(v)}" for k, v in r["figures"].items()).replace("|", "/")
        verdict = "" if r["ok"] else " **FAILED: " + "; ".join(
            ([r["error"]] if r["error"] else []) + r.get("missed", []) + inv["failures"]) + "**"
        lines.append(f"| {r['name']} | {r['turns']} ({t['completed']} completed so far, {t['cut']} cut by a kill) "
                     f"| {len(t['lost'])} / {len(t['duplicated'])} | {inv['curated_once']}/{inv['observations']}, "
                     f"{len(inv['learning_duplicates'])} duplicate learnings | "
                     f"{' / '.join(inv['integrity'].values())} | {files}, {len(inv['debris'])}, {len(inv['orphans'])} "
                     f"| {figures}{verdict} |")
    return "\n".join(lines)


def update_docs(doc: dict[str, Any], section: str = "chaos") -> None:
    rewrite_between(DOCS, section, table(doc))


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", choices=list(SCENARIOS), help="run only these scenarios")
    parser.add_argument("--seed", type=int, default=12, help="the random moments' seed")
    parser.add_argument("--smoke", action="store_true", help="a few turns and short faults (what make test runs)")
    parser.add_argument("--freeze-seconds", type=float, help="how long the freeze lasts (default 60)")
    parser.add_argument("--lock-seconds", type=float, help="how long each lock is held (default 30)")
    parser.add_argument("--long-turns", type=int, help="turns of the long run (default 1500)")
    parser.add_argument("--ack-kills", type=int, help="kills right after turn_complete, per disk (default 50)")
    parser.add_argument("--power-cuts", type=int, help="power cuts right after turn_complete (default 20)")
    parser.add_argument("--outage-seconds", type=float, help="how long the proxy is down (default 300)")
    parser.add_argument("--update-docs", action="store_true", help="rewrite the table in docs/reliability.md")
    parser.add_argument("--from-results", action="store_true",
                        help="with --update-docs: take the figures from chaos/results/latest.json, run nothing")
    parser.add_argument("--section", default="chaos",
                        help="with --update-docs: the table's markers in docs/reliability.md (NAME:results:start)")
    args = parser.parse_args()
    if args.from_results:
        update_docs(json.loads((RESULTS / "latest.json").read_text()), args.section)
        return 0
    os.environ.setdefault("SPRITE_LOG_LEVEL", "warning")
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # as Ctrl-C: the run stops its server, unmounts
    overrides = {k: v for k, v in (("seed", args.seed), ("freeze_seconds", args.freeze_seconds),
                                   ("lock_seconds", args.lock_seconds), ("long_turns", args.long_turns),
                                   ("ack_kills", args.ack_kills), ("power_cuts", args.power_cuts),
                                   ("outage_seconds", args.outage_seconds))
                 if v is not None}
    plan = Plan.smoke(**overrides) if args.smoke else Plan(**overrides)
    names = args.only or list(SCENARIOS)
    meta = {"date": time.strftime("%Y-%m-%d"), "machine": _machine(), "seed": plan.seed, "smoke": args.smoke,
            "plan": {k: v for k, v in plan.__dict__.items() if k not in ("disk", "disk_skip")}}
    began = time.monotonic()
    # As a test run: the CLIs in a HOME of their own (not the host's ~/.claude), and what a deployed Sprite
    # changes on the host (its CLI copy under /var/lib/sprite-os, kernel settings) put back at the end.
    with own_home("sprite-chaos-home-"), HostLedger(()), tempfile.TemporaryDirectory(prefix="sprite-chaos-") as tmp:
        results: list[Result] = asyncio.run(run(Path(tmp), plan, names, say=lambda s: print(s, flush=True)))
    meta["seconds"] = round(time.monotonic() - began)
    doc = {"_meta": meta, "ok": all(r.ok for r in results), "scenarios": [r.as_json() for r in results]}
    RESULTS.mkdir(parents=True, exist_ok=True)
    latest = RESULTS / ("smoke.json" if args.smoke else "latest.json")
    if args.only and latest.exists():  # a partial run replaces its rows and keeps the others
        earlier = json.loads(latest.read_text())
        mine = {r["name"]: r for r in doc["scenarios"]}
        rows = [mine.pop(r["name"], r) for r in earlier["scenarios"]] + list(mine.values())
        meta["reran"] = {**earlier["_meta"].get("reran", {}), **{n: meta["date"] for n in names}}
        doc = {"_meta": {**earlier["_meta"], "reran": meta["reran"]}, "ok": all(r["ok"] for r in rows),
               "scenarios": rows}
    latest.write_text(json.dumps(doc, indent=2))
    if args.update_docs:
        update_docs(doc, args.section)
    print("chaos: " + ("every invariant held" if doc["ok"] else "FAILED"), file=sys.stderr)
    return 0 if doc["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
