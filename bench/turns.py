"""Turn latency, measured side by side in one run, through the real Claude Code CLI.

- overhead: a turn through Sprite OS (WebSocket in, frames out, memory on)
  against the same turn driven through the SDK directly, on the same mock Bridge;
- hooks: memory on against memory off, as paired turns with an A/A check (memory off against
  itself), and the time memory spends on the agent's path (capturing the turn from the runtime's
  stream; the compaction hooks never fire here);
- curator: turn latency while the curator's proxy takes 5 s, against 0 s;
- relay: a turn through the SDK with the CLI reaching the mock Bridge through the model relay,
  against the same with the CLI connected to it directly;
- isolation: the CLI as its own user (SPRITE_ISOLATION=user: launcher, pid namespace, uid switch)
  against the same server with isolation off, each turn running a Bash command (as root only).

Paths are interleaved turn by turn so that drift on the machine hits both alike.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import itertools
import os
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import AsyncExitStack
from functools import partial
from pathlib import Path
from typing import Any

from claude_agent_sdk import ClaudeAgentOptions, ClaudeSDKClient, ResultMessage

from bench.stats import paired, percentile, ratio, summary_ms
from devkit.harness import Client, client_factory, make_settings, running
from devkit.mock_bridge import Fault, MockBridge, Text, ToolCall, Turn
from sprite_os.agent.budget import AgentLimits
from sprite_os.agent.environment import cli_environment
from sprite_os.agent.model_relay import ModelRelay
from sprite_os.agent.spend_book import SpendBook
from sprite_os.memory.transcript_store import NewObservation, TranscriptDB
from sprite_os.runtime import BUILTIN_TOOLS, DEFAULT_PROMPT, MAX_CLI_MESSAGE_BYTES
from sprite_os.server import SpriteOS
from sprite_os.tools.canvas import CanvasStore, canvas_server

WARMUP = 3

TurnFn = Callable[[int], Awaitable[float]]


def _script(bridge: MockBridge) -> None:
    """Every measured turn does the same work: one tool call, then a short answer."""
    bridge.agent.script(Turn(ToolCall("mcp__canvas__list_cards", {}), Text("There are no cards open right now.")))


def _script_bash(bridge: MockBridge) -> None:
    """A turn that runs a command: the agent's user, in its namespace, starts a process."""
    bridge.agent.script(Turn(ToolCall("Bash", {"command": "ls documents"}), Text("Nothing there yet.")))


async def server_turn(bridge: MockBridge, c: Client, n: int,
                       script: Callable[[MockBridge], None] = _script) -> float:
    script(bridge)
    started = time.perf_counter()
    await c.send(type="user_message", text=f"turn {n}: list my cards")
    turn = await c.until("turn_started", lambda f: f["text"] == f"turn {n}: list my cards")
    await c.until("turn_complete", lambda f: f["turn_id"] == turn["turn_id"])
    return time.perf_counter() - started


async def interleave(paths: dict[str, TurnFn], turns: int, alternate: bool = False,
                      orders: Sequence[Sequence[str]] | None = None) -> dict[str, list[float]]:
    """One turn of each path a round; samples[name][i] is round i's. `alternate` (two paths): the
    rounds go AB, BA, AB, ..., so that what one path's turn leaves running (memory's capture and
    indexing) falls on the other's next turn as often. Three paths need `carry_balanced`'s orders:
    cycling all six orders makes one path follow itself and another never. `orders`: the rounds
    cycle through these orders instead."""
    samples: dict[str, list[float]] = {name: [] for name in paths}
    if orders is None:
        if alternate and len(paths) != 2:
            raise ValueError("alternate takes two paths; give three carry_balanced's orders")
        orders = list(itertools.permutations(paths)) if alternate else [tuple(paths)]
    for n in range(turns + WARMUP):
        for name in orders[n % len(orders)]:
            took = await paths[name](n)
            if n >= WARMUP:
                samples[name].append(took)
    return samples


def carry_balanced(a: str, b: str, c: str) -> list[tuple[str, str, str]]:
    """Rounds of three paths, run back to back (a b c a c b a b c ...), in which each path's turn
    follows each other path's equally often and never its own: whatever a turn leaves running
    (the CLI's own after-turn work, memory's indexing) falls on the others alike. A turn right
    after the same server's previous one is slower (225 ms against 153-169 ms, loaded machine):
    the cycle of all six orders did that to one path in six rounds and not to another, and an
    A/A pair read 0.85."""
    return [(a, b, c), (a, c, b)]


def tree_cpu_s() -> float:
    """CPU seconds used so far by this process (every thread) and its living descendants (the CLIs),
    read from the scheduler's nanosecond counters: a turn's CPU is the difference across it, which
    other work on the machine slows but does not add to, unlike its wall time."""
    total = time.process_time()
    todo = _children(os.getpid())
    while todo:
        pid = todo.pop()
        with contextlib.suppress(OSError, ValueError):  # it exited meanwhile
            for task in os.listdir(f"/proc/{pid}/task"):
                total += int(Path(f"/proc/{pid}/task/{task}/schedstat").read_text().split()[0]) / 1e9
            todo += _children(pid)
    return total


def _children(pid: int) -> list[int]:
    out: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                out += [int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
    return out


def _with_cpu(fn: TurnFn, into: list[float]) -> TurnFn:
    """`fn`, also noting each turn's CPU (tree_cpu_s) in `into`."""
    async def turn(n: int) -> float:
        before = tree_cpu_s()
        took = await fn(n)
        into.append(tree_cpu_s() - before)
        return took

    return turn


async def server_client(stack: AsyncExitStack, app: SpriteOS) -> Client:
    factory = await stack.enter_async_context(client_factory(app.port))
    return await factory(hello={})


async def _sdk_path(stack: AsyncExitStack, bridge: MockBridge, workspace: Path,
                    model_env: Mapping[str, str]) -> TurnFn:
    """A CLI driven through the SDK directly, as the runtime configures it, reaching the model as
    `model_env` says: a turn function for interleave."""
    os.mkdir(workspace)
    canvas = CanvasStore(workspace / "canvas.json", lambda _f: None)
    sdk = ClaudeSDKClient(ClaudeAgentOptions(
        system_prompt=DEFAULT_PROMPT, cwd=str(workspace), setting_sources=[], tools=list(BUILTIN_TOOLS),
        allowed_tools=[*BUILTIN_TOOLS, "mcp__canvas"], mcp_servers={"canvas": canvas_server(canvas)},
        include_partial_messages=True, env=cli_environment(os.environ, model_env),
        max_buffer_size=MAX_CLI_MESSAGE_BYTES))
    await sdk.connect()
    stack.push_async_callback(sdk.disconnect)

    async def turn(n: int) -> float:
        _script(bridge)
        started = time.perf_counter()
        await sdk.query(f"turn {n}: list my cards")
        async for message in sdk.receive_response():
            if isinstance(message, ResultMessage):
                break
        return time.perf_counter() - started

    return turn


async def overhead(turns: int) -> dict[str, Any]:
    async with MockBridge() as bridge, AsyncExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        settings = make_settings(tmp / "server", bridge.url, memory_batch_turns=100_000)
        app = await stack.enter_async_context(running(settings))
        client = await server_client(stack, app)
        direct = await _sdk_path(stack, bridge, tmp / "direct", settings.model_env())
        samples = await interleave(
            {"sdk_direct": direct, "sprite_os": lambda n: server_turn(bridge, client, n)}, turns)
    a, b = summary_ms(samples["sprite_os"]), summary_ms(samples["sdk_direct"])
    return {"sprite_os": a, "sdk_direct": b, "ratio_median": ratio(a["median_ms"], b["median_ms"]),
            "overhead_median_ms": round(a["median_ms"] - b["median_ms"], 3)}


PAST = "_with_past"  # the label's end for hooks' line whose memory-on workspace holds a past session


async def _model_speeds(turns: int, model_latency: float | None, past_turns: int = 0
                        ) -> AsyncIterator[tuple[str, int, MockBridge, AsyncExitStack, Path]]:
    """A fixed cost per turn, measured twice, each on a fresh mock Bridge and scratch folder: with a
    zero-latency model (the cost is all there is to see), then with `model_latency` seconds per
    model request (closer to life; None: not measured), on a third as many turns; `past_turns`: also
    with a zero-latency model, labelled for hooks' workspace with a past (0: not). Yields (label,
    turns, bridge, the exit stack to enter servers on, the folder)."""
    speeds = [("zero_latency", 0.0, turns)]
    if past_turns:
        speeds.append((f"zero_latency{PAST}", 0.0, past_turns))
    if model_latency is not None:
        speeds.append((f"model_{model_latency:g}s", model_latency, turns // 3))
    for label, latency, n in speeds:
        async with MockBridge() as bridge, AsyncExitStack() as stack:
            if latency:
                bridge.faults.add(Fault("latency", seconds=latency, target="agent"))
            yield label, n, bridge, stack, Path(stack.enter_context(tempfile.TemporaryDirectory()))


BLOCK_ROUNDS = 30  # rounds per set of fresh servers (memory on / off / off again)
PATHS = ("memory_on", "memory_off", "memory_off_again")
PAST_TURNS = 40  # the past session a memory-on workspace holds in the "with a past" line
PAST_SESSION = "20261125T090000-past00"
CAUGHT_UP_WAIT = 300.0  # seconds, at most, for a workspace's past to be indexed and embedded


def with_past(workspace: Path) -> Path:
    """`workspace` holding a past session of PAST_TURNS turns, a day old, like the bench's own: auto-recall
    then searches for real (words and meaning) before every message, as it does after a first session."""
    layout = make_settings(workspace, "http://127.0.0.1:9").layout
    layout.ensure()
    db = TranscriptDB(layout.transcript_db)
    try:
        day_ago = time.time() - 86_400
        for n in range(1, PAST_TURNS + 1):
            db.append(NewObservation(
                timestamp=day_ago + n, session_id=PAST_SESSION, sequence_num=n, user_message=f"turn {n}: list my cards",
                tool_calls_json='[{"name": "mcp__canvas__list_cards", "input": "{}", "output": "[]", "is_error": false}]',
                agent_response="There are no cards open right now."))
    finally:
        db.close()
    return workspace


async def caught_up(app: SpriteOS) -> None:
    """Until the server's index and vectors hold what its workspace recorded before it started."""
    assert app.memory is not None
    indexer = app.memory.recall.indexer
    async with asyncio.timeout(CAUGHT_UP_WAIT):
        await indexer.current.wait()
        if indexer.embed is not None:
            await indexer.embedded_all.wait()


async def hooks(turns: int, model_latency: float | None = 0.3, past_rounds: int | None = None) -> dict[str, Any]:
    """Memory on against off, first with a zero-latency model (any fixed cost per turn, such as the
    durable commit's wait before turn_complete, is all there is to see), then the same with the
    memory-on workspace holding a past session (`past_rounds` rounds, by default half as many; 0: not
    measured), then with `model_latency` seconds per model request (closer to life).

    Three servers run at once on one mock Bridge, each in a fresh workspace (its first session, but
    in the line "with a past": memory on's holds an earlier session of PAST_TURNS turns, indexed and
    embedded before the rounds begin, so auto-recall searches it before every message):
    memory on, memory off, and memory off again. Each round sends one turn to each, in orders that
    balance what a turn leaves behind (carry_balanced), and times it from the client's send to its
    turn_complete. The cost is the median of the rounds' paired ratios on / off (and differences),
    with a bootstrap 95% interval: a round's turns see the same machine, so its drift leaves the
    comparison. Two identical servers also differ for as long as they live (their CLIs' JIT, where
    their memory lies: an A/A pair read 0.87 in one run and 1.00 in the next), so every
    BLOCK_ROUNDS rounds all three are replaced by fresh ones, and the interval draws whole blocks
    first. The second memory-off server is the A/A check in the same run: off again / off must
    read 1.00 within its interval, or the run shows noise, not memory."""
    out: dict[str, Any] = {}
    async for label, n, bridge, _stack, tmp in _model_speeds(turns, model_latency,
                                                             turns // 2 if past_rounds is None else past_rounds):
        past = label.endswith(PAST)
        samples: dict[str, list[float]] = {name: [] for name in PATHS}
        cpu: dict[str, list[float]] = {name: [] for name in PATHS}
        blocks: list[int] = []
        inside_us: list[float] = []
        recorded = 0
        for block, rounds in enumerate(_blocks(n)):
            async with AsyncExitStack() as servers:
                workspace = tmp / f"{block}-on"
                on = await servers.enter_async_context(running(make_settings(
                    with_past(workspace) if past else workspace, bridge.url, memory_batch_turns=100_000)))
                if past:
                    await caught_up(on)
                offs = [await servers.enter_async_context(
                    running(make_settings(tmp / f"{block}-{name}", bridge.url), memory=False))
                    for name in ("off", "off_again")]
                clients = {name: await server_client(servers, app)
                           for name, app in zip(PATHS, (on, *offs), strict=True)}
                used: dict[str, list[float]] = {name: [] for name in PATHS}
                got = await interleave({name: _with_cpu(partial(server_turn, bridge, c), used[name])
                                         for name, c in clients.items()}, rounds, orders=carry_balanced(*PATHS))
                for name in PATHS:
                    samples[name] += got[name]
                    cpu[name] += used[name][WARMUP:]
                blocks += [block] * rounds
                assert on.memory is not None
                inside_us += [ns / 1000 for ns in on.memory.timings.samples_ns]  # capture's steps, per call
                recorded += (await on.memory.transcript.call(lambda t: t.counts()))["total"]
        a, b = summary_ms(samples["memory_on"]), summary_ms(samples["memory_off"])
        cost = paired(samples["memory_on"], samples["memory_off"], blocks)
        out[label] = {"memory_on": a, "memory_off": b, "memory_off_again": summary_ms(samples["memory_off_again"]),
                      "ratio_median": cost["ratio"], "ratio_ci95": cost["ratio_ci95"],
                      "added_median_ms": cost["diff_ms"], "added_ci95_ms": cost["diff_ci95_ms"],
                      "pairs": cost["pairs"], "blocks": len(set(blocks)),
                      "ratio_of_medians": ratio(a["median_ms"], b["median_ms"]),
                      "aa": paired(samples["memory_off_again"], samples["memory_off"], blocks),
                      "cpu": {"memory_on_ms": round(1000 * statistics.median(cpu["memory_on"]), 2),
                              "memory_off_ms": round(1000 * statistics.median(cpu["memory_off"]), 2),
                              "on_off": paired(cpu["memory_on"], cpu["memory_off"], blocks),
                              "aa": paired(cpu["memory_off_again"], cpu["memory_off"], blocks)},
                      "rounds_ms": {name: [round(1000 * x, 2) for x in xs] for name, xs in samples.items()},
                      "rounds_cpu_ms": {name: [round(1000 * x, 2) for x in xs] for name, xs in cpu.items()},
                      "rounds_block": blocks}
        if label == "zero_latency":
            out["inside_hooks_us"] = {"p50": round(percentile(inside_us, 50), 1),
                                      "p99": round(percentile(inside_us, 99), 1), "max": round(max(inside_us), 1),
                                      "calls": len(inside_us), "calls_per_turn": round(len(inside_us) / max(1, recorded), 2),
                                      "per_turn": round(sum(inside_us) / max(1, recorded), 1)}
            out["turns_recorded"] = recorded
    return out


def _blocks(rounds: int) -> list[int]:
    """`rounds` measured rounds as blocks of about BLOCK_ROUNDS (each has its own warm-up)."""
    count = max(1, round(rounds / BLOCK_ROUNDS))
    return [rounds // count + (1 if i < rounds % count else 0) for i in range(count)]


async def curator_latency(turns: int, seconds: float = 5.0) -> dict[str, Any]:
    async with MockBridge() as fast_bridge, MockBridge() as slow_bridge, AsyncExitStack() as stack:
        slow_bridge.faults.add(Fault("latency", seconds=seconds, target="curator"))
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        fast = await stack.enter_async_context(running(make_settings(tmp / "fast", fast_bridge.url,
                                                                     memory_batch_turns=1)))
        slow = await stack.enter_async_context(running(make_settings(tmp / "slow", slow_bridge.url,
                                                                     memory_batch_turns=1)))
        c_fast, c_slow = await server_client(stack, fast), await server_client(stack, slow)
        samples = await interleave({"curator_0s": lambda n: server_turn(fast_bridge, c_fast, n),
                                     f"curator_{seconds:g}s": lambda n: server_turn(slow_bridge, c_slow, n)}, turns)
        curator_calls = {"curator_0s": len(fast_bridge.curator_requests()),
                         f"curator_{seconds:g}s": len(slow_bridge.curator_requests())}
    a, b = summary_ms(samples[f"curator_{seconds:g}s"]), summary_ms(samples["curator_0s"])
    return {f"curator_{seconds:g}s": a, "curator_0s": b, "ratio_median": ratio(a["median_ms"], b["median_ms"]),
            "curator_calls_during_run": curator_calls}


async def relay(turns: int, model_latency: float = 0.3) -> dict[str, Any]:
    """The model relay's cost per turn (two model requests, one streamed tool call), side by side
    with the CLI connected to the proxy directly: with a zero-latency model (the relay's fixed cost
    is all there is to see), then with `model_latency` seconds per model request."""
    out: dict[str, Any] = {}
    async for label, n, bridge, stack, tmp in _model_speeds(turns, model_latency):
        # As the server configures it: with the agent's budget, which reads each reply's usage.
        book = SpendBook(AgentLimits.of(make_settings(tmp, bridge.url)), tmp / "agent_spend.json")
        model_relay = await stack.enter_async_context(ModelRelay(bridge.url, "bench-proxy-key", book=book))
        direct = await _sdk_path(stack, bridge, tmp / "direct",
                                 {"ANTHROPIC_BASE_URL": bridge.url, "ANTHROPIC_API_KEY": "bench-proxy-key"})
        relayed = await _sdk_path(stack, bridge, tmp / "relayed", model_relay.cli_env())
        samples = await interleave({"direct": direct, "relay": relayed}, n)
        requests = len(bridge.agent_requests())
        a, b = summary_ms(samples["relay"]), summary_ms(samples["direct"])
        out[label] = {"relay": a, "direct": b, "ratio_median": ratio(a["median_ms"], b["median_ms"]),
                      "added_median_ms": round(a["median_ms"] - b["median_ms"], 2),
                      "model_requests_per_turn": round(requests / (2 * (n + WARMUP)), 2)}
    return out


async def isolation(turns: int) -> dict[str, Any]:
    """User isolation against none, side by side (workspaces in /tmp, which the agent's user can reach)."""
    import os
    import pwd
    import shutil

    from devkit.host import remove_user
    from sprite_os.deploy_contract import ensure_agent_user

    if os.geteuid() != 0:
        return {"skipped": "user isolation needs root"}
    agent = os.environ.get("SPRITE_BENCH_AGENT_USER") or f"sprite-b{os.getpid()}"  # its own: see tests/conftest.py
    try:
        pwd.getpwnam(agent)
    except KeyError:
        ensure_agent_user(agent)
        atexit.register(remove_user, agent)
    async with MockBridge() as bridge, AsyncExitStack() as stack:
        tmp = Path(tempfile.mkdtemp(prefix="sprite-os-bench-", dir="/tmp"))
        stack.callback(shutil.rmtree, tmp, True)
        os.chmod(tmp, 0o755)
        # Like for like: the agent's user has a fresh home, so the CLI without isolation gets one
        # too. With root's (pyenv's shell start-up, years of ~/.claude) each Bash command took
        # 130 ms more, and isolation looked three times faster than none.
        (tmp / "home").mkdir()
        stack.enter_context(_environ(HOME=str(tmp / "home")))
        user = await stack.enter_async_context(running(make_settings(
            tmp / "user", bridge.url, memory_batch_turns=100_000, isolation="user", agent_user=agent)))
        none = await stack.enter_async_context(running(make_settings(
            tmp / "none", bridge.url, memory_batch_turns=100_000, isolation="none")))
        assert user.launch.mode == "user" and none.launch.mode == "none"
        c_user, c_none = await server_client(stack, user), await server_client(stack, none)
        samples = await interleave(
            {"user": lambda n: server_turn(bridge, c_user, n, _script_bash),
             "none": lambda n: server_turn(bridge, c_none, n, _script_bash)}, turns, alternate=True)
    a, b = summary_ms(samples["user"]), summary_ms(samples["none"])
    return {"user": a, "none": b, "ratio_median": ratio(a["median_ms"], b["median_ms"]),
            "added_median_ms": round(a["median_ms"] - b["median_ms"], 2)}


@contextlib.contextmanager
def _environ(**values: str) -> Iterator[None]:
    """Set environment variables for the block (the in-process servers' CLIs inherit them)."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
