"""What a server start leaves unimported until it is needed: each of these modules costs a start a
tenth of a second of CPU or more, and a restart, a test's server or an operator's command pays it
every time. Checked in a fresh interpreter (this worker has imported everything long since), so an
eager import anywhere on the start's path fails here."""

from __future__ import annotations

import asyncio
import gc
import json
import subprocess
import sys
from pathlib import Path

import pytest

from devkit.harness import TOKEN, make_settings, running
from devkit.processes import free_port, kit_env
from sprite_os.commands.main import main
from sprite_os.memory.curation.curator import MIN_BATCH_TOKENS

# A start on a workspace that served before, and what is in sys.modules when it is ready; then after
# the relay made its client towards the proxy (a CLI about to start), and after the stop.
_RESTART = """
import asyncio, json, sys
from pathlib import Path
from devkit.harness import make_settings, running

HEAVY = ("sqlite_utils", "httpcore2", "anyio", "claude_agent_sdk", "anthropic")

def loaded():
    return sorted(m for m in HEAVY if m in sys.modules)

async def main():
    seen = {}
    async with running(make_settings(Path(sys.argv[1]), "http://127.0.0.1:9")) as app:
        seen["ready"] = loaded()
        app.relay.cli_env()
        seen["cli_env"] = loaded()
        await app.relay.prepare()
        seen["prepared"] = loaded()
    seen["stopped"] = loaded()
    seen["client_after_stop"] = app.relay._client is not None
    print(json.dumps(seen))

asyncio.run(main())
"""


async def test_a_restart_imports_neither_the_schema_builder_nor_the_proxy_client(tmp_path: Path) -> None:
    """sqlite-utils builds the schemas: a database already at its version opens without it. The relay's
    client towards the proxy (httpx's transport: httpcore, anyio) is made when a CLI is about to start
    (`prepare`, which the runtime awaits), not at the server's start nor by `cli_env`: a start that runs
    no turn never pays for it. The stop closes it and makes no other."""
    workspace = tmp_path / "ws"
    async with running(make_settings(workspace, "http://127.0.0.1:9")):
        pass  # the databases made and migrated, as a first start does
    run = await asyncio.to_thread(subprocess.run, [sys.executable, "-c", _RESTART, str(workspace)], env=kit_env(),
                                  capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen["ready"] == [] and seen["cli_env"] == []
    assert seen["prepared"] == seen["stopped"] == ["anyio", "httpcore2"]  # made for the CLI, before its first call
    assert seen["client_after_stop"] is False


# Every `sprite-os` command builds the whole parser (the memory commands' too); these two need no event loop.
_COMMANDS = """
import json, sys
from sprite_os.commands.main import main

codes = [main(["version"]), main(["service", "status"])]
print(json.dumps([codes, sorted(m for m in ("asyncio", "structlog", "sqlite_utils", "numpy") if m in sys.modules)]))
"""


def test_a_command_that_needs_no_event_loop_does_not_import_asyncio(tmp_path: Path) -> None:
    """asyncio (with ssl, logging and concurrent.futures: some 30 ms of CPU) was imported by the memory
    commands' module, whose parser every command builds; only `memory rebuild` runs a loop there."""
    env = {**kit_env(), "SPRITE_WORKSPACE": str(tmp_path / "ws")}
    run = subprocess.run([sys.executable, "-c", _COMMANDS], env=env, capture_output=True, text=True, timeout=120,
                         check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    codes, loaded = json.loads(run.stdout.strip().splitlines()[-1])
    assert codes == [0, 3]  # printed the version; no server running
    assert loaded == []


# `sprite-os serve` in this process, the collections from its server's import on counted until /healthz
# answers (those during the import apart), then SIGTERM.
_SERVE = """
import gc, json, os, signal, sys, threading, time, urllib.request
from sprite_os.commands.main import main

collections, importing = [], []

def counted(phase, info):
    if phase != "start" or "sprite_os.server" not in sys.modules:
        return
    collections.append(info["generation"])
    # the server's import under way: its module is in sys.modules from the import's start, and its
    # last definition, serve_main, is there at its end
    if not hasattr(sys.modules["sprite_os.server"], "serve_main"):
        importing.append(info["generation"])

gc.callbacks.append(counted)
seen = {}

def watch():
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{os.environ['SPRITE_OS_PORT']}/healthz", None, 5)
            break
        except OSError:
            time.sleep(0.05)
    seen.update(collections=list(collections), importing=list(importing), frozen=gc.get_freeze_count() > 0,
                enabled=gc.isenabled())
    os.kill(os.getpid(), signal.SIGTERM)

threading.Thread(target=watch, daemon=True).start()
code = main(["serve"])
print(json.dumps({**seen, "code": code, "enabled_after": gc.isenabled()}))
"""


def test_a_serve_start_runs_no_collection_during_the_servers_import_then_freezes(tmp_path: Path) -> None:
    """What the server's import allocates (its modules) lives as long as the server: the collections it
    would set off find nothing to free. None runs during it; at its end one full collection, then a
    freeze; the collector is on from there (memory's start and its threads collect as ever), the start's
    own full collection comes before its freeze, and the collector is on for the life of the server."""
    env = {**kit_env(), "SPRITE_WORKSPACE": str(tmp_path / "ws"), "SPRITE_OS_PORT": str(free_port()),
           "SPRITE_OS_TOKEN": TOKEN, "ANTHROPIC_BASE_URL": "http://127.0.0.1:9", "SPRITE_ISOLATION": "none"}
    run = subprocess.run([sys.executable, "-c", _SERVE], env=env, capture_output=True, text=True, timeout=120,
                         check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen["importing"] == []  # an eager collector runs dozens here
    first, *rest = seen["collections"]
    assert first == 2  # the import's own, at its end, before its freeze
    assert 2 in rest  # SpriteOS.start's, before its freeze
    assert 0 in rest  # and the collector's own: on through the rest of the start
    assert seen["frozen"] and seen["enabled"] and seen["enabled_after"] and seen["code"] == 0


def test_a_start_that_fails_in_this_process_leaves_the_collector_on(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The collector is off over the server's import only: a start refused after it (a setting the memory
    system checks) finds it on, and leaves it on, or this process would never collect again."""
    monkeypatch.setenv("SPRITE_WORKSPACE", str(tmp_path))
    monkeypatch.setenv("SPRITE_OS_PORT", "0")
    monkeypatch.setenv("SPRITE_ISOLATION", "none")
    monkeypatch.setenv("SPRITE_MEMORY_BATCH_TOKENS", str(MIN_BATCH_TOKENS - 1))
    try:
        assert main(["serve"]) == 2
        assert gc.isenabled()
    finally:
        gc.enable()
        gc.unfreeze()  # the import's freeze took this worker's heap: collectable again
