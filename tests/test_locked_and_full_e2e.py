"""A locked database or a full disk loses nothing, through the real CLI: an operator's `sqlite3`
holding an exclusive lock on transcript.db while turns complete, or on memory.db during a batch,
past the busy timeout and through retries (held until the failures are seen, not for a fixed
time: `make chaos` holds one for 30 s); and the workspace on a tmpfs that fills up, then is freed."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from devkit import faults
from devkit.faults import FaultSetupFailed, exclusive_lock, fill
from devkit.mock_bridge import MockBridge
from sprite_os import database
from sprite_os.commands.main import main as cli
from sprite_os.config import Settings
from sprite_os.memory.curation import daemon as daemon_module
from sprite_os.server import SpriteOS
from tests.conftest import Client, client_factory, make_settings, running, wait_for
from tests.test_memory_e2e import learnings, observations, turn

pytestmark = pytest.mark.e2e


@pytest.fixture(autouse=True)
def short_busy_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """A write waits 1 s for a lock here, not the product's 5 s: the spell each test holds until it has
    seen the writes fail past the busy timeout and be retried comes five times sooner."""
    monkeypatch.setattr(database, "BUSY_TIMEOUT_MS", 1000)


async def timed_turn(c: Client, text: str) -> float:
    started = time.monotonic()
    done = await turn(c, text)
    assert done["status"] == "completed", done
    return time.monotonic() - started


def memory_status(settings: Settings, capsys: pytest.CaptureFixture[str]) -> dict:  # type: ignore[type-arg]
    capsys.readouterr()
    assert cli(["--workspace", str(settings.layout.root), "memory", "status", "--json"]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


async def test_an_exclusive_lock_on_the_transcript_loses_no_turn(
        bridge: MockBridge, settings: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    async with running(settings) as app, client_factory(app.port) as client:
        c = await client(hello={})
        normal = [await timed_turn(c, f"turn {n}") for n in range(1, 4)][1:]  # the first starts the CLI
        await wait_for(lambda: len(observations(settings)) == 3, timeout=60)
        async with exclusive_lock(settings.layout.transcript_db):
            locked = [await timed_turn(c, f"turn {n}") for n in range(4, 8)]
            # Held until the writes have failed past the busy timeout and been retried.
            await wait_for(lambda: app.memory is not None and app.memory.writer.health.failures >= 2, timeout=60)
            health = await app.health()
            assert health["status"] == "degraded" and health["memory"]["capture"]["degraded"]
            status = memory_status(settings, capsys)["capture"]
            assert status["degraded"] and status["spilled"] >= 1 and "locked" in status["last_error"]
            assert len(observations(settings)) == 3  # nothing more could be written yet
        await wait_for(lambda: len(observations(settings)) == 7, timeout=60)

        async def recovered() -> bool:  # /healthz's counts may be a second old: then it stops saying degraded
            return not (await app.health())["memory"]["capture"]["degraded"]
        await wait_for(recovered, timeout=10)
        with capsys.disabled():  # the figure docs/reliability.md quotes (pytest -s shows it)
            print(f"\nturn latency: {sum(normal) / len(normal):.3f} s unlocked, "
                  f"{sum(locked) / len(locked):.3f} s while transcript.db was locked (max {max(locked):.3f} s)")
        # Every turn completed while the lock was held: none waited for capture (the lock is only
        # released after them).
    recorded = observations(settings)
    assert [o.user_message for o in recorded] == [f"turn {n}" for n in range(1, 8)]  # in order, once each
    assert [o.sequence_num for o in recorded] == [1, 2, 3, 4, 5, 6, 7]
    assert not memory_status(settings, capsys)["capture"]["degraded"]


async def test_an_exclusive_lock_on_memory_db_during_a_batch_loses_nothing(
        monkeypatch: pytest.MonkeyPatch, bridge: MockBridge, settings: Settings) -> None:
    monkeypatch.setattr(daemon_module, "BACKOFF_FIRST", 0.5)
    monkeypatch.setattr(daemon_module, "BACKOFF_MAX", 2.0)
    settings = settings.with_overrides(memory_batch_turns=2)
    bridge.curator.default = "FACT: The user plans a trip to Lyon [#2]"  # every call, retried ones too
    async with running(settings) as app, client_factory(app.port) as client:
        assert app.memory is not None
        c = await client(hello={})
        async with exclusive_lock(settings.layout.memory_db):
            await timed_turn(c, "I plan a trip")
            await timed_turn(c, "to Lyon")
            # Held until the batch has failed on the lock and been retried (with backoff) at least once.
            await wait_for(lambda: app.memory is not None and app.memory.daemon.clock.failures >= 2, timeout=60)
            assert "locked" in (app.memory.daemon.health.last_error or "")
        await wait_for(lambda: all(o.processed == 1 for o in observations(settings)), timeout=60)
    assert [o.processed for o in observations(settings)] == [1, 1]
    assert learnings(settings) == [("FACT", "The user plans a trip to Lyon", 2)]  # once, however many calls


# ---------------------------------------------------------------- a full disk


@contextlib.contextmanager
def small_tmpfs(path: Path) -> Iterator[Path]:
    try:
        with faults.small_tmpfs(path) as mounted:
            yield mounted
    except FaultSetupFailed as exc:
        pytest.skip(str(exc))


async def test_a_full_disk_loses_no_turn(tmp_path: Path, bridge: MockBridge) -> None:
    with small_tmpfs(tmp_path / "disk") as disk:
        settings = make_settings(disk / "workspace", bridge.url)
        app: SpriteOS
        async with running(settings) as app, client_factory(app.port) as client:
            assert app.memory is not None
            c = await client(hello={})
            await timed_turn(c, "turn 1")
            await wait_for(lambda: len(observations(settings)) == 1, timeout=60)
            filler = fill(disk)
            for n in range(2, 6):
                await timed_turn(c, f"turn {n} " + "x" * 20_000)  # each needs new pages
            await wait_for(lambda: app.memory is not None and app.memory.writer.failing, timeout=60)
            assert "full" in (app.memory.writer.health.last_error or "")
            assert (await app.health())["status"] == "degraded"
            filler.unlink()
            await wait_for(lambda: len(observations(settings)) == 5, timeout=60)
            # The rows are visible once committed; the writer says it recovered a moment later, on the loop.
            await wait_for(lambda: app.memory is not None and not app.memory.writer.failing, timeout=60,
                           what="the transcript writer recovered")
        recorded = observations(settings)
        assert [o.user_message.split()[1] for o in recorded] == ["1", "2", "3", "4", "5"]
