"""The CLI's share of memory's cost on a zero-latency turn, and what the CLI waits for before its request.

    PYTHONPATH=. python -m bench.cli_share [ROUNDS [BLOCKS]]

Memory on gives the CLI more to carry: memory's section of the boot prompt and the search_memory
tool, in every model request. The hooks benchmark (bench/turns.py: hooks) sees that together with
capture and the durable commit; this tool measures it apart, in two parts, each in the hooks
benchmark's rounds (the same turn, carry-balanced orders, fresh servers every block):

- the CLI's share: memory on; memory off; and memory off whose CLI is given what memory on gives it
  (memory's boot prompt, the search_memory tool over an empty search): per turn, wall time, the CLIs'
  CPU and this process's CPU, each pair paired round by round (median and 95% interval). Memory on
  against the third server is what memory costs beyond what it gives the CLI;
- what the CLI waits for: memory off with a UserPromptSubmit hook answering at once, or after
  HOOK_DELAY s, against none: the time from the prompt written to the CLI's first model request, and
  to the hook's call. Auto-recall runs before the prompt is written; a hook could deliver its block
  into the same turn only if the CLI had work to do before it calls the hook, and did not wait
  for its answer after.

A tool for finding where a cost lies, not a benchmark with a target.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from bench import turns
from bench.stats import paired
from devkit.harness import make_settings, running
from devkit.mock_bridge import MockBridge
from sprite_os import runtime as rt
from sprite_os.agent import process
from sprite_os.tools import memory_search

HOOK_DELAY = 0.02
_prompts: dict[str, str] = {}  # a workspace's name -> the boot prompt its CLI gets instead of its own
_with_tool: set[str] = set()  # workspaces whose CLI also gets search_memory (over an empty search)
_hooked: dict[str, float | None] = {}  # workspaces whose CLI gets a UserPromptSubmit hook -> its delay
_marks: dict[str, float] = {}  # this turn's: the prompt written ("sent", "sent_at"), the hook called ("hook")


@contextlib.contextmanager
def patched() -> Iterator[None]:
    """The runtime's options and the CLI's send wrapped (for the workspaces named above), then put back."""
    options, send = rt.AgentRuntime._options, process.AgentProcess.send

    def _options(self: rt.AgentRuntime, system_prompt: Any) -> Any:
        from claude_agent_sdk import HookMatcher

        out = options(self, system_prompt)
        name = self._settings.workspace.name
        if name in _prompts:
            Path(system_prompt["path"]).write_text(_prompts[name])
        if name in _with_tool:
            async def search(_query: str, _limit: int) -> list[Any]:
                return []

            out.mcp_servers[memory_search.SERVER_NAME] = memory_search.memory_search_server(search)
            out.allowed_tools.append(f"mcp__{memory_search.SERVER_NAME}")
        if name in _hooked:
            delay = _hooked[name]

            async def on_prompt(_data: Any, _id: str | None, _ctx: Any) -> Any:
                _marks["hook"] = time.perf_counter()
                if delay:
                    await asyncio.sleep(delay)
                return {"hookSpecificOutput": {"hookEventName": "UserPromptSubmit", "additionalContext": "(none)"}}

            out.hooks.setdefault("UserPromptSubmit", []).append(HookMatcher(hooks=[on_prompt]))
        return out

    async def timed_send(self: process.AgentProcess, prompt: str, context: str | None = None) -> None:
        await send(self, prompt, context)
        _marks["sent"], _marks["sent_at"] = time.perf_counter(), time.time()  # the bridge's clock is time.time

    rt.AgentRuntime._options = _options
    process.AgentProcess.send = timed_send
    try:
        yield
    finally:
        rt.AgentRuntime._options, process.AgentProcess.send = options, send


def _cli_cpu() -> float:
    return turns.tree_cpu_s() - time.process_time()


async def _rounds(bridge: MockBridge, tmp: Path, names: tuple[str, str, str], rounds: int, blocks: int,
                  setup: Callable[[str, Any], Awaitable[None]]) -> dict[str, dict[str, list[float]]]:
    """`blocks` sets of fresh servers named `names` (memory on when the name starts with "on"), `rounds`
    carry-balanced rounds each; per server, each measured turn's figures."""
    out: dict[str, dict[str, list[float]]] = {name: {} for name in names}
    t0 = time.perf_counter()

    def note(name: str, what: str, value: float) -> None:
        out[name].setdefault(what, []).append(value)

    for block in range(blocks):
        async with AsyncExitStack() as servers:
            apps = {}
            for name in names:
                memory = name.startswith("on")
                settings = make_settings(tmp / f"{block}-{name}", bridge.url, memory_batch_turns=100_000)
                apps[name] = await servers.enter_async_context(running(settings, memory=memory))
                await setup(f"{block}-{name}", apps[name])
            clients = {name: await turns.server_client(servers, app) for name, app in apps.items()}

            def path(name: str, clients: dict[str, Any] = clients) -> turns.TurnFn:
                async def turn(k: int) -> float:
                    cli, own, asked = _cli_cpu(), time.process_time(), len(bridge.requests)
                    _marks.clear()
                    took = await turns.server_turn(bridge, clients[name], k)
                    if k >= turns.WARMUP:
                        note(name, "cli_cpu", _cli_cpu() - cli)
                        note(name, "server_cpu", time.process_time() - own)
                        first = next(r for r in bridge.requests[asked:] if r.kind == "messages")
                        note(name, "to_request", first.time - _marks["sent_at"])
                        if "hook" in _marks:
                            note(name, "to_hook", _marks["hook"] - _marks["sent"])
                    return took

                return turn

            got = await turns.interleave({name: path(name) for name in names}, rounds, orders=turns.carry_balanced(*names))
            for name in names:
                out[name].setdefault("wall", []).extend(got[name])
                out[name].setdefault("block", []).extend([block] * rounds)
    print(f"({time.perf_counter() - t0:.0f} s)")
    return out


def _report(out: dict[str, dict[str, list[float]]], pairs: list[tuple[str, str]], figures: tuple[str, ...]) -> None:
    for a, b in pairs:
        for what in figures:
            if what in out[a] and what in out[b]:
                p = paired(out[a][what], out[b][what], [int(x) for x in out[a]["block"]])
                print(f"  {a} - {b} {what}: {p['diff_ms']:+.2f} ms {p['diff_ci95_ms']} (ratio {p['ratio']} {p['ratio_ci95']})")
    for name, figs in out.items():
        medians = {w: round(1000 * statistics.median(v), 2) for w, v in figs.items() if w != "block"}
        print(f"  {name} (median ms): {medians}")


async def main(rounds: int, blocks: int) -> None:
    with patched():
        await _measure(rounds, blocks)


async def _measure(rounds: int, blocks: int) -> None:
    async with MockBridge() as bridge, AsyncExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))

        async def share(workspace: str, app: Any) -> None:
            if workspace.endswith("-on"):  # memory's boot prompt for this block, as its CLI gets it
                _prompts[workspace.replace("-on", "-given")] = await app.memory.boot_prompt()
                _with_tool.add(workspace.replace("-on", "-given"))

        print("the CLI's share: memory on / off / off given memory's prompt and tool")
        out = await _rounds(bridge, tmp / "share", ("on", "off", "given"), rounds, blocks, share)
        _report(out, [("on", "off"), ("given", "off"), ("on", "given")], ("wall", "cli_cpu", "server_cpu"))
        asked = [r for r in bridge.requests if r.kind == "messages" and r.target == "agent"]
        tool = f"mcp__{memory_search.SERVER_NAME}__search_memory"
        carrying = sum(any(t.get("name") == tool for t in (r.body or {}).get("tools", [])) for r in asked)
        print(f"  model requests carrying {tool}: {carrying} of {len(asked)} (two servers of three)")

        async def hooks(workspace: str, _app: Any) -> None:
            if workspace.endswith("-hook"):
                _hooked[workspace] = None
            elif workspace.endswith("-slowhook"):
                _hooked[workspace] = HOOK_DELAY

        print(f"what the CLI waits for: no hook / a UserPromptSubmit hook answering at once / after {HOOK_DELAY}s")
        out = await _rounds(bridge, tmp / "hooks", ("none", "hook", "slowhook"), rounds, blocks, hooks)
        _report(out, [("hook", "none"), ("slowhook", "none")], ("wall", "to_request", "to_hook"))


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:]]
    asyncio.run(main(*(args + [30, 2][len(args):])))
