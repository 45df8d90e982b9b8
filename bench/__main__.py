"""`make bench`: every benchmark in one run; results to bench/results/latest.json.

    python -m bench [--only NAME ...] [--quick] [--update-docs]

--update-docs rewrites the results table in docs/benchmarks.md (between its
`bench:results` markers) from this run, so the figures there stay true.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from devkit.docs_table import rewrite_between
from devkit.host import own_home
from sprite_os import __version__

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
DOCS = ROOT / "docs" / "benchmarks.md"


def _benchmarks(quick: bool) -> dict[str, Callable[[], Awaitable[dict[str, Any]]]]:
    from bench import (
        boot,
        downloads,
        durable,
        fanout,
        forget_lines,
        forget_speed,
        lexical,
        search,
        turns,
        vectors,
    )

    n = 10 if quick else 60

    async def recall_bench() -> dict[str, Any]:
        from bench.recall.run import recall

        return await recall(quick)

    async def deploy() -> dict[str, Any]:
        from bench import deploy_bench

        return await asyncio.to_thread(deploy_bench.run)

    return {
        "turn_overhead": lambda: turns.overhead(n),
        "fanout": lambda: fanout.fanout(50),
        "hooks": lambda: turns.hooks(3 * n),  # a ratio near 1.03 needs more turns than the others' spread
        "durable": lambda: durable.durable(n * 3),
        "curator_latency": lambda: turns.curator_latency(n),
        "relay": lambda: turns.relay(n),
        "isolation": lambda: turns.isolation(n),
        "search_1m": lambda: search.search(100_000 if quick else 1_000_000),
        "boot": boot.boot,
        "recall": recall_bench,
        "lexical": lambda: asyncio.to_thread(lexical.lexical, quick),
        "vectors": lambda: asyncio.to_thread(vectors.vectors, quick),
        "deploy": deploy,
        "downloads": lambda: downloads.downloads(16, (16 if quick else 99) * downloads.MIB),
        "forget_lines": lambda: asyncio.to_thread(forget_lines.forget_lines),
        "forget_speed": lambda: forget_speed.forget_speed(quick),
    }


def _rows(r: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(what, measured, target, verdict) for the docs table."""
    out: list[tuple[str, str, str, str]] = []

    def ok(cond: bool) -> str:
        return "met" if cond else "**missed**"

    if t := r.get("turn_overhead"):
        out.append(("server overhead per turn (Sprite OS / SDK direct, median)",
                    f"{t['ratio_median']:.2f} ({t['sprite_os']['median_ms']:.1f} ms vs {t['sdk_direct']['median_ms']:.1f} ms)",
                    "at most 1.05", ok(t["ratio_median"] <= 1.05)))
    if f := r.get("fanout"):
        many = f.get("50_clients", {})
        out.append(("fan-out latency, publish to client, 50 clients (p50 / p95, median of 3 rounds)",
                    f"{many.get('p50_ms', 0):.2f} / {many.get('p95_ms', 0):.2f} ms "
                    f"(1 client: {f['one_client']['p50_ms']:.2f} / {f['one_client']['p95_ms']:.2f} ms)",
                    "p50 under 10 ms", ok(many.get("p50_ms", 1e9) < 10)))
    if h := r.get("hooks"):
        for key, label in (("zero_latency", "zero-latency model"),
                           ("zero_latency_with_past", "zero-latency model, memory on's workspace with a past session"),
                           ("model_0.3s", "model answering in 0.3 s")):
            if v := h.get(key):
                bound = 1.03 if key == "zero_latency" else 1.05
                out.append((f"memory's cost per turn, memory on / off ({label}, median of the paired turns, "
                            "95% interval; A/A: memory off again / off)",
                            f"{v['ratio_median']:.3f} [{v['ratio_ci95'][0]:.3f}, {v['ratio_ci95'][1]:.3f}] "
                            f"(+{v['added_median_ms']:.1f} ms of {v['memory_off']['median_ms']:.1f}); A/A "
                            f"{v['aa']['ratio']:.3f} [{v['aa']['ratio_ci95'][0]:.3f}, {v['aa']['ratio_ci95'][1]:.3f}]",
                            *(("at most 1.03", _resolved(v, bound)) if key == "zero_latency" else
                              ("", "") if key.endswith("with_past") else ("near 1.00", _resolved(v, bound)))))
        inside = h["inside_hooks_us"]
        out.append(("time inside capture's steps on the agent's path (p50 / p99 per call)", f"{inside['p50']:.0f} / {inside['p99']:.0f} µs",
                    "p99 under 1 ms", ok(inside["p99"] < 1000)))
    if d := r.get("durable"):
        full, normal, journal, fsync = d["full"], d["normal"], d["journal"], d["fsync"]
        out.append(("a closed turn until durable, the wait before turn_complete: the first synced of transcript.db's "
                    "commit and the turn journal's append / the commit unsynced (before) / the turn journal, "
                    "transcript.db busy (median; p99)",
                    f"{full['median_ms']:.2f} / {normal['median_ms']:.2f} / {journal['median_ms']:.1f} ms "
                    f"({full['p99_ms']:.1f} / {normal['p99_ms']:.1f} / {journal['p99_ms']:.1f} ms; one fsync here: "
                    f"{fsync['median_ms']:.2f} ms)", "at most one fsync's wait a turn", ""))
    if c := r.get("curator_latency"):
        out.append(("turn latency, curator proxy 5 s / 0 s (median)",
                    f"{c['ratio_median']:.2f} ({c['curator_5s']['median_ms']:.1f} vs {c['curator_0s']['median_ms']:.1f} ms)",
                    "near 1.00", ok(c["ratio_median"] < 1.1)))
    if rl := r.get("relay"):
        for key, label in (("zero_latency", "zero-latency model"), ("model_0.3s", "model answering in 0.3 s")):
            if v := rl.get(key):
                target = "near 1.00" if key != "zero_latency" else ""  # zero latency: the fixed cost, shown
                out.append((f"model relay cost per turn, through the relay / straight to the proxy ({label}, median)",
                            f"{v['ratio_median']:.2f} ({v['relay']['median_ms']:.1f} vs {v['direct']['median_ms']:.1f} ms)",
                            target, ok(v["ratio_median"] < 1.05) if target else ""))
    if (i := r.get("isolation")) and "ratio_median" in i:
        out.append(("turn with a Bash command, agent as its own user / isolation off (median)",
                    f"{i['ratio_median']:.3f} ({i['user']['median_ms']:.1f} vs {i['none']['median_ms']:.1f} ms)",
                    "at most 1.02", ok(i["ratio_median"] <= 1.02)))
    if s := r.get("search_1m"):
        out.append((f"the fallback search (learnings' FTS5, no recall index) over {s['learnings']:,} learnings (p50 / p95)",
                    f"{s['median_ms']:.2f} / {s['p95_ms']:.2f} ms", "p95 under 5 ms", ok(s["p95_ms"] < 5)))
    if b := r.get("boot"):
        out.append(("boot assembly, full-size files (median / p95)", f"{b['median_ms']:.2f} / {b['p95_ms']:.2f} ms",
                    "under 5 ms", ok(b["p95_ms"] < 5)))
    if rc := r.get("recall"):
        out += _recall_rows(rc, ok)
    if lx := r.get("lexical"):
        out.append((f"word search over {lx['documents']:,} documents, each question naming a person half the "
                    "documents name: CPU p95 re-scoring the common words / reading every posting / without the "
                    "name; share of the exact top 10 kept; recall@10 re-scoring / reading every posting",
                    f"{lx['with_name']['cpu_p95_ms']:.1f} / {lx['with_name_exact']['cpu_p95_ms']:.1f} / "
                    f"{lx['without']['cpu_p95_ms']:.1f} ms; {lx['top10_kept']:.3f}; "
                    f"{lx['with_name']['recall@10']:.3f} / {lx['with_name_exact']['recall@10']:.3f}", "p95 under 10 ms",
                    ok(lx["with_name"]["cpu_p95_ms"] < 10)))
    if vx := r.get("vectors"):
        for n, row in ((k, v) for k, v in vx.items() if k.isdigit()):
            out.append((f"combined search, {int(n):,} vectors (CPU p50 / p95, query embedding included; the scan "
                        "alone p95)", f"{row['combined_cpu_p50_ms']:.1f} / {row['combined_cpu_p95_ms']:.1f} ms "
                        f"({row['scan_cpu_p95_ms']:.1f} ms)", "p95 under 100 ms", ok(row["combined_cpu_p95_ms"] < 100)))
            out.append((f"approximate vector scan against the exact one, {int(n):,} vectors (recall@10 / @50); "
                        "bytes a turn; open + first search in a new process", f"{row['recall@10']:.3f} / "
                        f"{row['recall@50']:.3f}; {row['bytes_per_vector']} B; {row['open_and_first_search_s']:.2f} s", "", ""))
    if dl := r.get("downloads"):
        out.append((f"the server's peak memory growth while {dl['clients']} clients download a {dl['file_mib']} MiB "
                    "file at once over the socket (permessage-deflate on, as a browser asks)",
                    f"{dl['peak_growth_mib']:.1f} MiB ({dl['mib_per_s']:.1f} MiB/s in all)", "under 100 MiB",
                    ok(dl["peak_growth_mib"] < 100)))
    if fl := r.get("forget_lines"):
        tune, held = fl["tune"]["chosen"], fl["held_out"]["chosen"]
        out.append((f"memory-file lines the curator reworded from a forgotten turn, found: words, or meaning at "
                    f"{fl['threshold']} with a {fl['margin']} margin to kept turns, and no kept turn saying most of the "
                    f"line's words (precision, recall), "
                    f"tuning part ({fl['tune']['pairs']} pairs) / held out ({fl['held_out']['pairs']} pairs)",
                    f"{tune['precision']:.3f}, {tune['recall']:.3f} / {held['precision']:.3f}, {held['recall']:.3f}",
                    "precision 1.0", ok(held["precision"] >= 1.0)))
    if fs := r.get("forget_speed"):
        first, second = fs["first"], fs["second"]
        out.append((f"a forget with {fs['lines']:,} distinct memory-file lines ({fs['versions']} versions): the "
                    "answer (words out, job on disk), then the lines decided, CPU time of the process; a second "
                    "forget after it (line vectors kept)",
                    f"answered in {first['answered_s']:.2f} s; decided in {first['cpu_s']:.1f} s CPU; second "
                    f"{second['cpu_s']:.1f} s CPU", "", ""))
    if d := r.get("deploy"):
        for key, label, target in (
                ("fresh_deploy_s", "fresh deploy (venv built from a local wheelhouse)", ""),
                ("fresh_deploy_venv_cache_s", "fresh deploy with --venv-cache", ""),
                ("update_deploy_s", "deploy of a new version (same lock: venv reused)", ""),
                ("noop_redeploy_s", "no-op redeploy (same version)", "well under 1 s"),
                ("migrate_100k_s", f"migrate a v1 workspace: {d.get('migrate_rows', 0):,} rows, "
                                   f"{d.get('migrate_observations', 0):,} observations", "")):
            if key in d:
                verdict = ok(d[key] < 1) if target else ""
                out.append((label, f"{d[key]:.2f} s", target, verdict))
    return out


def _resolved(v: dict[str, Any], bound: float) -> str:
    """A paired ratio's verdict: met when its whole interval is at most `bound`, missed when all of
    it is above; otherwise, or when the same run's A/A interval misses 1.00, the run could not tell."""
    lo, hi = v["ratio_ci95"]
    aa_lo, aa_hi = v["aa"]["ratio_ci95"]
    if not aa_lo <= 1.0 <= aa_hi:
        return "unresolved (A/A)"
    return "met" if hi <= bound else "**missed**" if lo > bound else "unresolved"


def _recall_rows(rc: dict[str, Any], ok: Callable[[bool], str]) -> list[tuple[str, str, str, str]]:
    out: list[tuple[str, str, str, str]] = []
    if d := rc.get("dialogue"):
        fused = d["fused"]
        lo, hi = d["searched_turns"]
        out.append((f"recall on the dialogue benchmark: one memory of its {d['eras']} eras ({d['turns']:,} turns), "
                    f"{fused['questions']} questions, each searching the turns before it ({lo:,} to {hi:,}, "
                    f"{d['searched_turns_mean']:,} on average) (any@10 / all@10, fused)", f"{fused['r@10']:.3f} / {fused['all@10']:.3f}",
                    "at least 0.87 / 0.75", ok(fused["r@10"] >= 0.87 and fused["all@10"] >= 0.75)))
        out.append((f"...its {fused['several_turns']} questions whose evidence is 2 to 4 turns (all@10, fused)",
                    f"{fused['several_turns_all@10']:.3f}", "", ""))
        if "fused_tuning" in d:
            out.append(("...the same, fused, on a seeded half of the questions / the other half (held out: "
                        "any@10 / all@10)", " / ".join(f"{d[k]['r@10']:.3f} / {d[k]['all@10']:.3f}"
                                                       for k in ("fused_tuning", "fused_held_out")), "", ""))
        if then := d.get("fused_groups_then"):
            out.append(("...the same, fused, in two memories of five eras each, asked then, as measured before (any@10 / "
                        "all@10; several turns all@10; the halves)",
                        f"{then['r@10']:.3f} / {then['all@10']:.3f}; {then['several_turns_all@10']:.3f}; " + " / ".join(
                            f"{d[k]['r@10']:.3f} / {d[k]['all@10']:.3f}"
                            for k in ("fused_groups_then_tuning", "fused_groups_then_held_out")), "", ""))
        if whole := d.get("fused_whole_workspace"):
            out.append(("...the same, fused, every question against its five eras' whole workspace, years after it too, as "
                        "before (any@10 / all@10; "
                        "several turns all@10; the halves)",
                        f"{whole['r@10']:.3f} / {whole['all@10']:.3f}; {whole['several_turns_all@10']:.3f}; " + " / ".join(
                            f"{d[k]['r@10']:.3f} / {d[k]['all@10']:.3f}"
                            for k in ("fused_whole_workspace_tuning", "fused_whole_workspace_held_out")), "", ""))
        rows = [("fused without the ranking policies", "fused_plain"), ("words only", "lexical"),
                ("the reference FTS5 method", "reference_fts5"), ("the reference RRF method", "reference_rrf")]
        out += [(f"...the same, {label} (any@10 / all@10; several turns all@10)",
                 f"{d[k]['r@10']:.3f} / {d[k]['all@10']:.3f}; {d[k]['several_turns_all@10']:.3f}", "", "")
                for label, k in rows if k in d]
    if small := rc.get("small"):
        fused, lexical = small["fused"], small["lexical"]
        out.append((f"recall@10 on the first benchmark, {small['turns']:,} turns (fused / lexical; r@1 / r@5 / r@20 fused)",
                    f"{fused['r@10']:.3f} / {lexical['r@10']:.3f} ({fused['r@1']:.3f} / {fused['r@5']:.3f} / "
                    f"{fused['r@20']:.3f})", "fused at least 0.85", ok(fused["r@10"] >= 0.85)))
    if a := rc.get("auto_recall"):
        words = a.get("lexical")
        alone = f"; words alone: {words['evidence_in_block']:.3f} / {words['unrelated_with_block']:.3f}" if words else ""
        out.append(("auto-recall: evidence in the block (dialogue questions) / unrelated messages given a block",
                    f"{a['evidence_in_block']:.3f} / {a['unrelated_with_block']:.3f} ({a['tokens_mean']:.0f} tokens on "
                    f"average, at most {a['tokens_max']}{alone})", "at least 0.75 / at most 0.10",
                    ok(a["evidence_in_block"] >= 0.75 and a["unrelated_with_block"] <= 0.10)))
    if b := rc.get("backfill"):
        moments = [k for k in b if k.endswith("%")]
        out.append(("while vectors catch up (every other turn first, each pass newest first; at " + " / ".join(moments) + " embedded): recall@10 of the "
                    "questions whose evidence has no vector yet, against the same with vectors",
                    " / ".join(f"{b[m]['r@10_without_vector']:.3f} vs {b[m]['r@10_with_vector']:.3f}" for m in moments),
                    "within 2 points", ok(all(abs(b[m]["gap_points"]) <= 2 for m in moments))))
        out.append(("...the same questions by word search alone (evidence ranked below it: "
                    f"{b['evidence_ranked_below_words_alone']})",
                    " / ".join(f"{b[m]['r@10_words_alone']:.3f}" for m in moments), "never above the first",
                    ok(b["evidence_ranked_below_words_alone"] == 0)))
    if scale := rc.get("scale"):
        n = scale["filler_turns"]
        out.append((f"recall@10 among {n:,} turns + {n:,} learnings, first benchmark placed oldest / newest (lexical)",
                    f"{scale['old']['r@10']:.3f} / {scale['new']['r@10']:.3f}", "gap under 2 points",
                    ok(scale["gap_points"] < 2)))
        out.append((f"search latency at {n:,} + {n:,}, lexical (CPU p50 / p95)",
                    f"{scale['new']['cpu_p50_ms']:.2f} / {scale['new']['cpu_p95_ms']:.2f} ms", "p95 under 10 ms",
                    ok(scale["new"]["cpu_p95_ms"] < 10)))
    if cost := rc.get("auto_recall_cost"):
        out.append(("auto-recall added per turn, fused / lexical only (wall p95)",
                    f"{cost['fused']['p95_ms']:.1f} / {cost['lexical']['p95_ms']:.2f} ms",
                    "under 100 / 20 ms", ok(cost["fused"]["p95_ms"] < 100 and cost["lexical"]["p95_ms"] < 20)))
    return out


def _table(results: dict[str, Any]) -> str:
    meta = results["_meta"]
    lines = [f"Measured {meta['date']} on {meta['machine']} (Sprite OS {meta['version']}, "
             f"Python {meta['python']}).", "", "| what | measured | target | |", "| --- | --- | --- | --- |"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in _rows(results)]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", help="run only these benchmarks")
    parser.add_argument("--quick", action="store_true", help="fewer turns, 100k learnings: a smoke run")
    parser.add_argument("--update-docs", action="store_true", help="rewrite the table in docs/benchmarks.md")
    args = parser.parse_args()
    os.environ.setdefault("SPRITE_LOG_LEVEL", "warning")
    from sprite_os.logs import configure_logging

    configure_logging(level="warning")
    benches = _benchmarks(args.quick)
    chosen = args.only or list(benches)
    results: dict[str, Any] = {"_meta": {
        "date": time.strftime("%Y-%m-%d"), "version": __version__, "python": platform.python_version(),
        "machine": f"{os.cpu_count()} cores, {platform.machine()}, {platform.system()}", "quick": args.quick}}
    with own_home("sprite-bench-home-"):  # the CLIs the benchmarks start leave nothing in the host's HOME
        for name in chosen:
            print(f"bench: {name} ...", file=sys.stderr, flush=True)
            started = time.perf_counter()
            results[name] = asyncio.run(benches[name]())
            results[name]["wall_s"] = round(time.perf_counter() - started, 1)
            print(json.dumps(results[name], indent=2), file=sys.stderr, flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    latest = RESULTS / "latest.json"
    if args.only and latest.exists():  # a partial run updates its rows and keeps the others
        results = {**json.loads(latest.read_text()), **results}
    latest.write_text(json.dumps(results, indent=2))
    print(_table(results))
    if args.update_docs:
        rewrite_between(DOCS, "bench", _table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
