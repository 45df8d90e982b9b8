"""The memory on / off benchmark's design: paired statistics, an order that balances carry-over, and a
line whose memory-on workspace has a past."""

from __future__ import annotations

import ast
import asyncio
import itertools
import math
from collections import Counter
from pathlib import Path

import pytest

from bench.stats import bootstrap_median_ci, paired
from bench.turns import (
    PAST_SESSION,
    PAST_TURNS,
    WARMUP,
    TurnFn,
    carry_balanced,
    interleave,
    with_past,
)
from devkit.harness import make_settings
from sprite_os.memory.system import MemorySystem


def _sequence(orders: list[tuple[str, str, str]], rounds: int) -> list[str]:
    ran: list[str] = []

    def path(name: str) -> TurnFn:
        async def turn(_n: int) -> float:
            ran.append(name)
            return 0.0
        return turn

    samples = asyncio.run(interleave({name: path(name) for name in "abc"}, rounds, orders=orders))
    assert all(len(s) == rounds for s in samples.values())
    return ran[WARMUP * 3:]


def test_each_path_follows_each_other_path_equally_and_never_itself() -> None:
    ran = _sequence(carry_balanced("a", "b", "c"), 180)
    follows = Counter(itertools.pairwise(ran))
    assert not [pair for pair in follows if pair[0] == pair[1]]  # no turn right after its own server's
    counts = sorted(follows.values())
    assert len(follows) == 6 and counts[-1] - counts[0] <= 1


def test_alternating_takes_two_paths_only() -> None:
    """Cycling every order of three paths made one follow itself once in six rounds and another never."""
    with pytest.raises(ValueError, match="two paths"):
        asyncio.run(interleave({name: _noop for name in "abc"}, 6, alternate=True))


async def _noop(_n: int) -> float:
    return 0.0


def test_paired_reads_the_per_round_ratio_not_the_drift() -> None:
    # Both sides drift by a factor of 2 across the run; b is 2% slower than a in every round.
    a = [0.050 * (1 + i / 100) for i in range(100)]
    b = [x * 1.02 for x in a]
    out = paired(b, a)
    assert out["ratio"] == pytest.approx(1.02)
    assert out["ratio_ci95"][0] == pytest.approx(1.02) and out["ratio_ci95"][1] == pytest.approx(1.02)
    assert out["pairs"] == 100 and out["diff_ms"] > 0


def test_bootstrap_interval_holds_the_median_and_narrows_with_more_samples() -> None:
    few = [float(i % 7) for i in range(21)]
    many = few * 20
    lo, hi = bootstrap_median_ci(few)
    assert lo <= 3.0 <= hi
    lo_many, hi_many = bootstrap_median_ci(many)
    assert hi_many - lo_many <= hi - lo
    assert all(math.isnan(x) for x in bootstrap_median_ci([]))
    with pytest.raises(ValueError):
        paired([1.0], [1.0, 2.0])


async def test_the_line_with_a_past_gives_memory_on_a_past_session_that_auto_recall_searches(tmp_path: Path) -> None:
    """A first session has nothing to recall (auto-recall returns at once): the line with a past
    measures the cost of every later session, a search by words and meaning before each message."""
    workspace = with_past(tmp_path / "on")
    settings = make_settings(workspace, "http://127.0.0.1:9").with_overrides(embedding_model="off")
    system = MemorySystem(settings)
    await system.start()
    try:
        await asyncio.wait_for(system.recall.indexer.current.wait(), 30)
        assert system.recall.indexer.reach.beyond("20261126T000000-bench0")
        found = await system.search("list my cards", 50)
        assert len(found) == PAST_TURNS and {h.session_id for h in found} == {PAST_SESSION}
    finally:
        await system.stop()


async def test_the_spans_bench_wraps_names_that_exist_and_puts_them_back() -> None:
    """bench/spans.py wraps private names of the runtime, the CLI process, capture's writer and journal,
    recall, the SDK and the bench's turn (and the running loop's wake-ups from threads): each must still
    exist (a rename would leave a wrapper nobody calls), and leaving puts every one back."""
    from bench import spans

    targets = (spans.rt.AgentRuntime, spans.process.AgentProcess, spans.writer, spans.service,
               spans.sdk_query.Query, spans.journal.JournalFile, spans.turns)
    loop = asyncio.get_running_loop()
    before = [dict(vars(t)) for t in targets]
    with spans.instrumented(spans.Recorder()):
        during = [dict(vars(t)) for t in targets]
        assert "call_soon_threadsafe" in vars(loop)  # counted, on this loop alone
    after = [dict(vars(t)) for t in targets]
    assert "call_soon_threadsafe" not in vars(loop)
    wrapped = {(i, name) for i, (old, new) in enumerate(zip(before, during, strict=True))
               for name in old.keys() | new.keys() if old.get(name) is not new.get(name)}
    assert len(wrapped) >= 10
    assert all(name in before[i] for i, name in wrapped), wrapped  # none added: each wraps one that exists
    assert after == before


async def test_the_loop_cpu_bench_charges_each_turn_to_its_server_and_puts_its_wrappers_back() -> None:
    """bench/loop_cpu.py wraps the runtime's submit and the bench's interleave: leaving puts both back.
    The loop's CPU goes to the server whose turn was submitted last, none to a server's warm-up turns,
    and none after a block's last round (its servers' stop and the next block's start are no one's)."""
    from types import SimpleNamespace

    from bench import loop_cpu

    runtime, turns = loop_cpu.rt.AgentRuntime, loop_cpu.turns
    real = (vars(runtime)["submit"], vars(turns)["interleave"])
    submitted: list[str] = []

    async def a_block(*_args: object, **_kw: object) -> dict[str, list[float]]:
        return {}

    def a_submit(_self: object, text: str, client_id: str | None = None) -> None:
        submitted.append(text)

    runtime.submit, turns.interleave = a_submit, a_block  # type: ignore[method-assign,assignment]
    try:
        charger = loop_cpu.Charger(profile=False)
        with loop_cpu.charged(charger):
            assert vars(runtime)["submit"] is not a_submit and turns.interleave is not a_block
            on = SimpleNamespace(_settings=SimpleNamespace(workspace=Path("/x/0-on")))
            for n in range(turns.WARMUP + 2):
                runtime.submit(on, f"turn {n}")  # type: ignore[arg-type]
            assert charger.turns == {"on": 2, "off": 0, "off_again": 0} and len(charger.cpu["on"]) == 1
            await turns.interleave({}, 0)  # the block ends: its last turn with it
            assert len(charger.cpu["on"]) == 2
        assert vars(runtime)["submit"] is a_submit and turns.interleave is a_block
        assert submitted == [f"turn {n}" for n in range(turns.WARMUP + 2)]
    finally:
        runtime.submit, turns.interleave = real  # type: ignore[method-assign]


def test_the_cli_share_bench_wraps_names_that_exist_and_puts_them_back() -> None:
    """bench/cli_share.py wraps the runtime's options and the CLI's send (to give a memory-off CLI memory's
    prompt and tool, a UserPromptSubmit hook, and to time the prompt's write): each must still exist, and
    leaving puts both back."""
    from bench import cli_share

    targets = (cli_share.rt.AgentRuntime, cli_share.process.AgentProcess)
    before = [dict(vars(t)) for t in targets]
    with cli_share.patched():
        during = [dict(vars(t)) for t in targets]
    after = [dict(vars(t)) for t in targets]
    wrapped = {name for old, new in zip(before, during, strict=True)
               for name in old.keys() | new.keys() if old.get(name) is not new.get(name)}
    assert wrapped == {"_options", "send"}
    assert after == before


def _private_uses(source: str, name: str) -> list[str]:
    """Where `source` (the module `name`) reaches into another bench module's private names: imported
    (`from bench.turns import _x`, `from .build import _x`: bench/recall's modules import one another
    relatively), or read off a module imported whole (`turns._x`, `from . import build as B; B._x`,
    `import bench.turns as T; T._x`)."""
    tree = ast.parse(source)
    found = []
    shared = set()  # the names bench's own modules are imported under here
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] == "bench"):
            found += [f"{name}:{node.lineno} imports {a.name}" for a in node.names if a.name.startswith("_")]
            shared |= {a.asname or a.name for a in node.names}
        elif isinstance(node, ast.Import):
            shared |= {a.asname for a in node.names if a.asname and a.name.split(".")[0] == "bench"}
    found += [f"{name}:{node.lineno} {node.value.id}.{node.attr}" for node in ast.walk(tree)
              if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
              and node.value.id in shared and node.attr.startswith("_") and not node.attr.startswith("__")]
    return found


def test_a_benchmark_uses_another_benchmarks_module_only_through_its_public_names() -> None:
    """bench/cli_share.py drove its servers through bench/turns.py's private helpers (`turns._server_turn`,
    `_interleave`, ...): a rename or a change of their contract inside turns.py would break another tool
    that nothing said depended on them. What one benchmark shares with another is public."""
    bench = Path(__file__).resolve().parents[1] / "bench"
    found = [use for path in sorted(bench.rglob("*.py")) for use in _private_uses(path.read_text(), path.name)]
    assert found == []


def test_the_private_names_check_sees_relative_and_whole_module_imports() -> None:
    """The check read only `from bench...` imports: bench/recall's modules import one another relatively
    (`from . import generate`), and those reached no private name the check could see."""
    source = ("from . import build as B\nfrom .generate import _filler\nimport bench.turns as T\n"
              "from bench import turns\nB._progress(); T._server_turn(); turns._interleave(); B.__name__\n")
    assert _private_uses(source, "m.py") == ["m.py:2 imports _filler", "m.py:5 B._progress",
                                             "m.py:5 T._server_turn", "m.py:5 turns._interleave"]


def test_the_serve_start_bench_gives_up_on_a_server_that_does_not_stop() -> None:
    """A server that hangs in its stop would hold the bench (and whoever runs it) for ever: it gives up
    at its deadline, and the caller kills the server."""
    import subprocess
    import sys
    import time

    from bench.serve_start import _reap

    ignoring = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(flush=True); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", ignoring], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline()  # SIGTERM ignored from here
        proc.terminate()
        started = time.monotonic()
        with pytest.raises(SystemExit, match="did not stop"):
            _reap(proc.pid, time.monotonic() + 0.3)
        assert time.monotonic() - started < 5
    finally:
        proc.kill()
        proc.wait()
