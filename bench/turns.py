"""Turn latency, measured side by side in one run, through the real Claude Code CLI.

- overhead: a turn through Sprite OS (WebSocket in, frames out, memory on)
  against the same turn driven through the SDK directly, on the same mock Bridge;
- hooks: memory on against memory off, and the time memory spends on the agent's path
  (capturing the turn from the runtime's stream; the compaction hooks never fire here);
- curator: turn latency while the curator's proxy takes 5 s, against 0 s;
- relay: a turn through the SDK with the CLI reaching the mock Bridge through the model relay,
  against the same with the CLI connected to it directly;
- isolation: the CLI as its own user (SPRITE_ISOLATION=user: launcher, pid namespace, uid switch)
  against the same server with isolation off, each turn running a Bash command (as root only).

Paths are interleaved turn by turn so that drift on the machine hits both alike.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from claude_agent_sdk import ClaudeAgentOptions, ClaudeSDKClient, ResultMessage

from bench.stats import percentile, ratio, summary_ms
from devkit.harness import Client, client_factory, make_settings, running
from devkit.mock_bridge import Fault, MockBridge, Text, ToolCall, Turn
from sprite_os.agent.budget import AgentLimits
from sprite_os.agent.environment import cli_environment
from sprite_os.agent.model_relay import ModelRelay
from sprite_os.agent.spend_book import SpendBook
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


async def _server_turn(bridge: MockBridge, c: Client, n: int,
                       script: Callable[[MockBridge], None] = _script) -> float:
    script(bridge)
    started = time.perf_counter()
    await c.send(type="user_message", text=f"turn {n}: list my cards")
    turn = await c.until("turn_started", lambda f: f["text"] == f"turn {n}: list my cards")
    await c.until("turn_complete", lambda f: f["turn_id"] == turn["turn_id"])
    return time.perf_counter() - started


async def _interleave(paths: dict[str, TurnFn], turns: int, alternate: bool = False) -> dict[str, list[float]]:
    """`alternate`: every other round runs the paths in reverse order, so that what one path's turn
    leaves running (memory's capture and indexing) falls on the other's next turn as often."""
    samples: dict[str, list[float]] = {name: [] for name in paths}
    for n in range(turns + WARMUP):
        order = list(paths.items())
        for name, fn in (order[::-1] if alternate and n % 2 else order):
            took = await fn(n)
            if n >= WARMUP:
                samples[name].append(took)
    return samples


async def _server_client(stack: AsyncExitStack, app: SpriteOS) -> Client:
    factory = await stack.enter_async_context(client_factory(app.port))
    return await factory(hello={})


async def _sdk_path(stack: AsyncExitStack, bridge: MockBridge, workspace: Path,
                    model_env: Mapping[str, str]) -> TurnFn:
    """A CLI driven through the SDK directly, as the runtime configures it, reaching the model as
    `model_env` says: a turn function for _interleave."""
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
        client = await _server_client(stack, app)
        direct = await _sdk_path(stack, bridge, tmp / "direct", settings.model_env())
        samples = await _interleave(
            {"sdk_direct": direct, "sprite_os": lambda n: _server_turn(bridge, client, n)}, turns)
    a, b = summary_ms(samples["sprite_os"]), summary_ms(samples["sdk_direct"])
    return {"sprite_os": a, "sdk_direct": b, "ratio_median": ratio(a["median_ms"], b["median_ms"]),
            "overhead_median_ms": round(a["median_ms"] - b["median_ms"], 3)}


async def _model_speeds(turns: int, model_latency: float
                        ) -> AsyncIterator[tuple[str, int, MockBridge, AsyncExitStack, Path]]:
    """A fixed cost per turn, measured twice, each on a fresh mock Bridge and scratch folder: with a
    zero-latency model (the cost is all there is to see), then with `model_latency` seconds per
    model request (closer to life), on a third as many turns. Yields (label, turns, bridge, the
    exit stack to enter servers on, the folder)."""
    for label, latency, n in (("zero_latency", 0.0, turns), (f"model_{model_latency:g}s", model_latency, turns // 3)):
        async with MockBridge() as bridge, AsyncExitStack() as stack:
            if latency:
                bridge.faults.add(Fault("latency", seconds=latency, target="agent"))
            yield label, n, bridge, stack, Path(stack.enter_context(tempfile.TemporaryDirectory()))


async def hooks(turns: int, model_latency: float = 0.3) -> dict[str, Any]:
    """Memory on against off, first with a zero-latency model (any fixed cost per turn, such as the
    CLI's ~4 ms per hook event, is all there is to see), then with `model_latency` seconds per
    model request (closer to life)."""
    out: dict[str, Any] = {}
    async for label, n, bridge, stack, tmp in _model_speeds(turns, model_latency):
        on = await stack.enter_async_context(
            running(make_settings(tmp / "on", bridge.url, memory_batch_turns=100_000)))
        off = await stack.enter_async_context(running(make_settings(tmp / "off", bridge.url), memory=False))
        c_on, c_off = await _server_client(stack, on), await _server_client(stack, off)
        # alternate: the turn after memory on's otherwise always pays for its indexing, not its own
        samples = await _interleave({"memory_on": lambda n, c=c_on, b=bridge: _server_turn(b, c, n),
                                     "memory_off": lambda n, c=c_off, b=bridge: _server_turn(b, c, n)}, n,
                                    alternate=True)
        assert on.memory is not None
        inside_us = [ns / 1000 for ns in on.memory.timings.samples_ns]  # capture's steps, per call
        recorded = (await on.memory.transcript.call(lambda t: t.counts()))["total"]
        a, b = summary_ms(samples["memory_on"]), summary_ms(samples["memory_off"])
        out[label] = {"memory_on": a, "memory_off": b, "ratio_median": ratio(a["median_ms"], b["median_ms"]),
                      "added_median_ms": round(a["median_ms"] - b["median_ms"], 2)}
        if label == "zero_latency":
            out["inside_hooks_us"] = {"p50": round(percentile(inside_us, 50), 1),
                                      "p99": round(percentile(inside_us, 99), 1), "max": round(max(inside_us), 1),
                                      "calls": len(inside_us), "calls_per_turn": round(len(inside_us) / max(1, recorded), 2),
                                      "per_turn": round(sum(inside_us) / max(1, recorded), 1)}
            out["turns_recorded"] = recorded
    return out


async def curator_latency(turns: int, seconds: float = 5.0) -> dict[str, Any]:
    async with MockBridge() as fast_bridge, MockBridge() as slow_bridge, AsyncExitStack() as stack:
        slow_bridge.faults.add(Fault("latency", seconds=seconds, target="curator"))
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        fast = await stack.enter_async_context(running(make_settings(tmp / "fast", fast_bridge.url,
                                                                     memory_batch_turns=1)))
        slow = await stack.enter_async_context(running(make_settings(tmp / "slow", slow_bridge.url,
                                                                     memory_batch_turns=1)))
        c_fast, c_slow = await _server_client(stack, fast), await _server_client(stack, slow)
        samples = await _interleave({"curator_0s": lambda n: _server_turn(fast_bridge, c_fast, n),
                                     f"curator_{seconds:g}s": lambda n: _server_turn(slow_bridge, c_slow, n)}, turns)
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
        samples = await _interleave({"direct": direct, "relay": relayed}, n)
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
        c_user, c_none = await _server_client(stack, user), await _server_client(stack, none)
        samples = await _interleave(
            {"user": lambda n: _server_turn(bridge, c_user, n, _script_bash),
             "none": lambda n: _server_turn(bridge, c_none, n, _script_bash)}, turns, alternate=True)
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
