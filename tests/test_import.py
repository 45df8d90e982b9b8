"""`memory import`: lines checked one by one (a bad line reported by number and skipped, never a
traceback), turns identified by session, time and text so that importing again adds exactly what is
missing, and the turns recorded through the workspace's one writer and searchable when it returns."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from devkit.harness import loop_ticks
from sprite_os.backoff import Backoff
from sprite_os.commands.main import main as cli
from sprite_os.config import Settings
from sprite_os.fsutil import WriterLock
from sprite_os.memory import import_inbox
from sprite_os.memory.importer import BadLine, ReadReport, apply, parse, read_turns, timestamp
from sprite_os.memory.memory_store import MemoryDB
from sprite_os.memory.recall import episodes as ep
from sprite_os.memory.system import MemorySystem
from sprite_os.memory.transcript_store import ImportedTurn, TranscriptDB
from sprite_os.paths import Layout
from tests.test_recall import lexical

NOW = 1_800_000_000.0
LINES = [
    {"session": "v1-a", "timestamp": 1_600_000_000, "user": "We adopted a dog called Biscuit", "assistant": "Lovely!"},
    {"session": "v1-a", "timestamp": "2020-09-13T12:30:00Z", "user": "Biscuit hates the vacuum cleaner"},
    {"session": "v1-b", "timestamp": "2021-03-05T09:00:00", "user": "My PIN is <private>4321</private>, ok?",
     "assistant": None, "tool_calls": [{"name": "Bash", "input": {"command": "ls"}, "output": "a.txt"}]},
]


def jsonl(path: Path, bad: bool = True) -> Path:
    rows = [json.dumps(x) for x in LINES]
    if bad:
        rows[1:1] = ["{not json", json.dumps({"session": "v1-a", "user": "no timestamp"}), ""]
        rows.append(json.dumps({"session": "", "timestamp": 1, "user": "x"}))
        rows.append(json.dumps(["a", "list"]))
    path.write_text("\n".join(rows) + "\n")
    return path


def turns_of(lines: list[str], now: float = NOW) -> tuple[list, ReadReport]:  # type: ignore[type-arg]
    report = ReadReport()
    return list(read_turns(io.StringIO("\n".join(lines) + "\n"), report, now)), report


def test_timestamps_are_epoch_seconds_or_iso_8601_from_1970_to_tomorrow() -> None:
    assert timestamp(1_600_000_000, NOW) == 1_600_000_000.0
    assert timestamp("2020-09-13T12:26:40Z", NOW) == 1_600_000_000.0
    assert timestamp("2020-09-13T12:26:40", NOW) == 1_600_000_000.0  # no offset: UTC
    assert timestamp("2020-09-13T14:26:40+02:00", NOW) == 1_600_000_000.0
    assert timestamp(NOW + 3600, NOW) == NOW + 3600  # a clock a little ahead
    for bad in ("yesterday", True, None, float("nan"), [1]):
        with pytest.raises(BadLine, match=r"epoch seconds|ISO 8601|out of range"):
            timestamp(bad, NOW)
    for far in (-5, 1e17, 1e30, float("inf"), 10 ** 400, NOW + 2 * 86_400, "9999-12-31T00:00:00Z", "0001-01-01"):
        with pytest.raises(BadLine, match="out of range: it must fall between 1970-01-01 and 2027-01-16"):
            timestamp(far, NOW)


def test_a_bad_line_says_why_and_never_raises_anything_else() -> None:
    deep = '{"session": "s", "timestamp": 1, "user": "x", "tool_calls": [{"input": ' + "[" * 3000 + "]" * 3000 + "}]}"
    deeper = '{"session": "s", "timestamp": 1, "user": ' + "[" * 100_000 + "]" * 100_000 + "}"
    cases = {
        '{"session": "s", "timestamp": 1e17, "user": "x"}': "out of range",
        '{"session": "s", "timestamp": 1e30, "user": "x"}': "out of range",
        '{"session": "s", "timestamp": ' + "9" * 400 + ', "user": "x"}': "out of range",
        '{"session": "s", "timestamp": 1e400, "user": "x"}': "number out of range",
        '{"session": "s", "timestamp": ' + "9" * 5000 + ', "user": "x"}': "out of range",
        '{"session": ' + "7" * 5000 + ', "timestamp": 1, "user": "x"}': "out of range",
        deep: "nested too deeply",
        deeper: "nested too deeply",
        "{not json": "not JSON",
        '"just a string"': "not a JSON object",
        '{"session": "s", "user": "x"}': "timestamp is missing",
        '{"session": "s", "timestamp": 1, "user": 5}': "user must be a string",
    }
    for line, why in cases.items():
        with pytest.raises(BadLine, match=why):
            parse(line, NOW)
    turns, report = turns_of(list(cases))
    assert turns == [] and [n for n, _ in report.bad] == list(range(1, len(cases) + 1))


def test_an_endless_line_is_read_past_not_held() -> None:
    endless = '{"session": "s", "timestamp": 1, "user": "' + "x" * 2_500_000 + '"}'
    turns, report = turns_of([endless, json.dumps(LINES[0])])
    assert [t.user_message for t in turns] == [LINES[0]["user"]]
    assert report.bad == [(1, "longer than 1,000,000 characters")]


def test_a_line_becomes_a_clean_turn() -> None:
    first, second, private = (parse(json.dumps(x), NOW) for x in LINES)
    assert (first.session_id, second.session_id, private.session_id) == ("v1-a", "v1-a", "v1-b")
    assert second.agent_response == "" and "4321" not in private.user_message and "[private]" in private.user_message
    assert json.loads(private.tool_calls_json)[0]["name"] == "Bash"


def test_importing_again_adds_exactly_the_missing_turns(tmp_path: Path) -> None:
    db = TranscriptDB(tmp_path / "t.db")
    chat = [{"session": "s", "timestamp": 1_600_000_000 + 60 * i, "user": f"message {i}", "assistant": f"answer {i}"}
            for i in range(6)]
    broken = [json.dumps(x) for x in chat]
    broken[2] = broken[2].replace('"timestamp"', '"timestmp"')  # a broken line: skipped
    turns, report = turns_of(broken)
    assert [n for n, _ in report.bad] == [3]
    first = apply(db, turns)
    assert (first.added, first.already) == (5, 0)
    fixed = [json.dumps(x) for x in chat]
    turns, _ = turns_of(fixed)
    again = apply(db, turns)
    assert (again.added, again.already) == (1, 5)  # the fixed line, and nothing twice
    extended = fixed + [json.dumps({"session": "s", "timestamp": 1_600_001_000 + i, "user": f"later {i}"})
                        for i in range(3)]
    turns, _ = turns_of(extended)
    more = apply(db, turns)
    assert (more.added, more.already) == (3, 6)  # a session's new turns: all three
    assert [o.user_message for o in db.iter_all()] == [
        "message 0", "message 1", "message 3", "message 4", "message 5", "message 2", "later 0", "later 1", "later 2"]
    assert len({o.sequence_num for o in db.iter_all()}) == 9  # numbers identify, they do not place
    turns, _ = turns_of(extended)
    assert apply(db, turns).added == 0
    # the fixed turn is placed by its time among its session's episodes
    memory = MemoryDB(tmp_path / "m.db")
    ep.add(memory.conn, [ep.from_observation(o) for o in db.iter_all()][:5])
    ep.add(memory.conn, [ep.from_observation(o) for o in db.iter_all()][5:])
    places = {e.text.split("\n")[0]: e.turn for e in ep.get(memory.conn, range(1, 10)).values()}
    assert places == {"message 0": 1, "message 1": 2, "message 2": 3, "message 3": 4, "message 4": 5,
                      "message 5": 6, "later 0": 7, "later 1": 8, "later 2": 9}
    memory.close()
    db.close()


def test_importing_again_never_brings_back_a_turn_a_person_forgot(tmp_path: Path) -> None:
    """A forgotten turn keeps its session and time, not its words: importing its file again finds its line
    recorded (as forgotten) and adds nothing, so its words never come back; a copy the file repeats counts
    it among its copies."""
    db = TranscriptDB(tmp_path / "t.db")
    ok = json.dumps({"session": "s", "timestamp": 1_600_000_000, "user": "ok", "assistant": "ok"})
    pin = json.dumps({"session": "s", "timestamp": 1_600_000_060, "user": "My PIN is 4321", "assistant": "Noted"})
    turns, _ = turns_of([ok, ok, pin])
    assert apply(db, turns).added == 3
    first_ok, _, secret = [o.id for o in db.iter_all()]
    db.forget([secret, first_ok], NOW, "test")
    turns, _ = turns_of([ok, ok, pin])
    again = apply(db, turns)
    assert (again.added, again.already) == (0, 3)
    assert not [o for o in db.iter_all() if "4321" in o.user_message]
    turns, _ = turns_of([ok, ok, ok, pin])  # a third copy is new
    assert apply(db, turns).added == 1
    db.close()


def test_a_turn_a_file_repeats_is_kept_as_often_as_the_file_holds_it(tmp_path: Path) -> None:
    db = TranscriptDB(tmp_path / "t.db")
    ok = json.dumps({"session": "s", "timestamp": 1_600_000_000, "user": "ok", "assistant": "ok"})
    turns, _ = turns_of([ok, ok])
    assert (apply(db, turns).added, db.counts()["total"]) == (2, 2)
    turns, _ = turns_of([ok, ok, ok])
    assert (apply(db, turns).added, db.counts()["total"]) == (1, 3)
    db.close()


def _cli(settings: Settings, *args: str) -> int:
    return cli(["--workspace", str(settings.workspace), "memory", *args])


@pytest.fixture
def workspace_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPRITE_EMBEDDING_MODEL", "off")


@pytest.mark.usefixtures("workspace_env")
def test_import_makes_the_memory_folder_and_leaves_the_turns_searchable(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    settings = lexical(tmp_path)  # a workspace that never served: no .os/ at all
    source = tmp_path / "past.jsonl"
    source.write_bytes(b"\xef\xbb\xbf" + jsonl(tmp_path / "plain.jsonl").read_bytes())  # with a BOM
    assert not settings.layout.memory_dir.exists()
    assert _cli(settings, "import", str(source)) == 1  # bad lines: reported, and said by the status
    out = capsys.readouterr()
    assert f"{source}:2: skipped: not JSON" in out.err and f"{source}:8: skipped" in out.err
    assert f"{source}:1:" not in out.err  # the BOM is not part of the first line
    assert "imported 3 turns from 2 sessions (0 already recorded, 4 bad lines); searchable now" in out.out
    assert _cli(settings, "search", "what does Biscuit hate?", "--json", "--limit", "2") == 0
    found = json.loads(capsys.readouterr().out)
    first = found["hits"][0]
    assert first["kind"] == "episode" and first["source"] == {"session": "v1-a", "turn": 2, "observation_id": 2}
    assert first["date"] == "2020-09-13T12:30:00Z" and "vacuum" in first["snippet"]
    assert _cli(settings, "import", str(jsonl(tmp_path / "good.jsonl", bad=False))) == 0
    assert "imported 0 turns from 2 sessions (3 already recorded" in capsys.readouterr().out
    assert not import_inbox.inbox_files(settings.layout)  # applied and gone
    assert _cli(settings, "status", "--json") == 0
    recall = json.loads(capsys.readouterr().out)["recall"]
    assert (recall["turns"], recall["episodes"], recall["turns_waiting_for_index"], recall["index_documents"]) == (
        3, 3, 0, 3)


@pytest.mark.usefixtures("workspace_env")
@pytest.mark.parametrize("kind", ["fifo", "device", "directory"])
def test_a_fifo_a_device_or_a_folder_is_refused_at_once(tmp_path: Path, kind: str,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    settings = lexical(tmp_path)
    path = tmp_path / "named"
    if kind == "fifo":
        os.mkfifo(path)  # opening it to read would wait for a writer forever
    elif kind == "device":
        path = Path("/dev/zero")  # reading it would never end
    else:
        path.mkdir()
    started = time.monotonic()
    assert _cli(settings, "import", str(path)) == 2
    assert time.monotonic() - started < 5
    assert f"is a {'FIFO' if kind == 'fifo' else kind}, not a file" in capsys.readouterr().err


@pytest.mark.usefixtures("workspace_env")
async def test_while_the_server_runs_it_records_the_import_itself(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    settings = lexical(tmp_path)
    system = MemorySystem(settings)  # holds the writer lock, as the server does
    await system.start()
    try:
        source = jsonl(tmp_path / "past.jsonl", bad=False)
        result: list[int] = []
        cli_thread = threading.Thread(target=lambda: result.append(_cli(settings, "import", str(source))))
        cli_thread.start()
        while cli_thread.is_alive():
            await asyncio.sleep(0.05)
        assert result == [0]
        out = capsys.readouterr()
        assert re.search(r"^the server \(pid \d+\) is recording the turns$", out.err, re.M)
        assert "imported 3 turns from 2 sessions (0 already recorded, 0 bad lines); the server indexes" in out.out
        # through the server's own transcript.db thread: the indexer took them, search finds them
        await asyncio.wait_for(system.recall.indexer.current.wait(), 10)
        hits = await system.search("what does Biscuit hate?", 3)
        assert hits and hits[0].session_id == "v1-a" and hits[0].turn == 2
        assert not import_inbox.inbox_files(settings.layout)
        assert not list(import_inbox.inbox_dir(settings.layout).iterdir())  # no progress file left behind
    finally:
        await system.stop()


def test_an_inbox_file_a_writer_was_killed_in_is_applied_again_without_doubles(tmp_path: Path) -> None:
    settings = lexical(tmp_path)
    settings.layout.ensure()
    turns, _ = turns_of([json.dumps(x) for x in LINES])
    path, n = import_inbox.write(settings.layout, turns)
    assert n == 3 and import_inbox.inbox_files(settings.layout) == [path]
    db = TranscriptDB(settings.layout.transcript_db)
    db.import_turns(turns[:2])  # a writer killed after its first chunk: the file is still there
    done = import_inbox.apply_file(db, path)
    assert (done.applied, done.added, done.already, done.done) == (3, 1, 2, True)
    assert db.counts()["total"] == 3 and not path.exists()
    db.close()


@pytest.mark.usefixtures("workspace_env")
def test_a_bad_time_already_stored_stops_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from sprite_os.memory.curation.curator import render_observation
    from sprite_os.memory.loader import turns_section
    from sprite_os.memory.transcript_store import NewObservation
    from sprite_os.text import utc

    settings = lexical(tmp_path)  # rows written before timestamps were checked
    settings.layout.ensure()
    db = TranscriptDB(settings.layout.transcript_db)
    for n, at in enumerate((1e17, 1e30, -1e30, 1_600_000_000.0), 1):
        db.append(NewObservation(timestamp=at, session_id="s", sequence_num=n, user_message=f"garden note {n}",
                                 tool_calls_json="[]", agent_response="ok"))
    stored = list(db.iter_all())
    db.close()
    assert [utc(o.timestamp, "%Y") for o in stored] == ["?", "?", "?", "2020"]
    assert all("?" in render_observation(o) for o in stored[:3])  # the daemon's prompt
    assert "garden note 1" in (turns_section(stored) or "")  # the boot prompt's turns not yet curated
    assert _cli(settings, "rebuild", "--index", "--yes") == 0
    capsys.readouterr()
    assert _cli(settings, "search", "garden note", "--json") == 0
    hits = json.loads(capsys.readouterr().out)["hits"]
    assert len(hits) == 4 and {h["date"] for h in hits} >= {"?", "2020-09-13T12:26:40Z"}
    monkeypatch.setattr("sys.stdin", io.StringIO("garden\nnote 2\n"))
    assert _cli(settings, "search", "-", "--json") == 0  # batch mode answers every line
    assert len(capsys.readouterr().out.splitlines()) == 2
    assert _cli(settings, "status") == 0


def test_one_listing_of_the_inbox_gives_the_files_waiting_and_those_set_aside(tmp_path: Path) -> None:
    """The files to apply and those the writer gave up on are the inbox's files by how their names end,
    oldest first: one function, where two near-copies listed the folder apart."""
    layout = Layout(tmp_path)
    assert import_inbox.inbox_files(layout) == import_inbox.inbox_files(layout, import_inbox.SET_ASIDE_ENDING) == []
    inbox = import_inbox.inbox_dir(layout)
    inbox.mkdir(parents=True)
    for name in ("b.jsonl", "a.jsonl", "c.jsonl.failed", "0.jsonl.failed", "a.progress.json", ".d.partial"):
        (inbox / name).write_text("")
    assert [p.name for p in import_inbox.inbox_files(layout)] == ["a.jsonl", "b.jsonl"]
    assert [p.name for p in import_inbox.inbox_files(layout, import_inbox.SET_ASIDE_ENDING)] == ["0.jsonl.failed",
                                                                                          "c.jsonl.failed"]


async def test_the_inbox_sweeps_what_a_kill_left_of_its_progress_reports(tmp_path: Path) -> None:
    """A kill between a progress report's temp file and its rename left `.x.progress.json.*.tmp`
    for good; the server's inbox, the one applier, sweeps its own on start and nothing else."""
    layout = Layout(tmp_path)
    layout.ensure()
    inbox = import_inbox.inbox_dir(layout)
    inbox.mkdir(parents=True, exist_ok=True)
    debris = inbox / ".a.progress.json.ab12cd34.tmp"
    other = inbox / ".notes.txt.ab12cd34.tmp"
    debris.write_text("{")
    other.write_text("{")
    await _inbox_started_until_gone(layout, debris)
    assert not debris.exists() and other.exists()


async def _inbox_started_until_gone(layout: Layout, path: Path) -> None:
    """The server's inbox started (with no file to apply) until `path` is gone (2 s at most), and stopped."""
    applier = import_inbox.ImportInbox(layout, None, lambda: None)  # type: ignore[arg-type]
    applier.start()
    try:
        for _ in range(200):
            if not path.exists():
                break
            await asyncio.sleep(0.01)
    finally:
        await applier.stop()


def test_the_names_an_import_writes_are_the_names_the_inbox_reads(tmp_path: Path) -> None:
    """The name was made in one place and read in another: changed on one side only, a killed import's
    `.partial` would never be swept again."""
    layout = Layout(tmp_path)
    layout.ensure()
    seen: list[str] = []

    def turns() -> Iterator[ImportedTurn]:
        for turn in turns_of([json.dumps(x) for x in LINES])[0]:
            seen.extend(p.name for p in import_inbox.inbox_dir(layout).iterdir())  # mid-write: the .partial
            yield turn

    final, _ = import_inbox.write(layout, turns())
    assert seen and all(import_inbox.PARTIAL.match(name) for name in seen)
    assert import_inbox.PARTIAL.match(seen[0])["pid"] == str(os.getpid())
    assert import_inbox.partial_name(final.name.removesuffix(import_inbox.SUFFIX)) == seen[0]


async def test_the_server_sweeps_a_partial_only_a_killed_import_can_have_left(tmp_path: Path) -> None:
    """A `memory import` killed while it wrote its inbox file left `.<name>.partial` for good: nothing
    applied or removed it. The server's start removes one whose writer is gone and which has not been
    written for an hour; one whose writer lives, or written a moment ago, or not the CLI's, stays."""
    layout = Layout(tmp_path)
    layout.ensure()
    inbox = import_inbox.inbox_dir(layout)
    inbox.mkdir(parents=True, exist_ok=True)
    dead = await asyncio.create_subprocess_exec("true")
    await dead.wait()  # its pid is no process now
    old = time.time() - 3600 - 60  # past the hour the sweep leaves a writer
    killed, fresh, living = (inbox / import_inbox.partial_name(import_inbox.inbox_name(pid, n)) for pid, n in (
        (dead.pid, 1),
        (dead.pid, 2),  # a writer in another pid namespace, say
        (os.getpid(), 3)))  # a live CLI, stopped for a while
    other = inbox / ".notes.partial"
    for path in (killed, fresh, living, other):
        path.write_text('{"session": "s"}\n')
    for path in (killed, living, other):
        os.utime(path, (old, old))
    await _inbox_started_until_gone(layout, killed)
    assert not killed.exists() and fresh.exists() and living.exists() and other.exists()


@pytest.mark.usefixtures("workspace_env")
async def test_a_file_the_sweep_may_not_remove_never_stops_the_inbox_applying(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The inbox's sweep let through only a file already gone: a removal refused (EACCES, a read-only
    mount) failed every pass of the inbox before it applied anything, so no import was applied again."""
    import errno

    settings = lexical(tmp_path)
    settings.layout.ensure()
    monkeypatch.setattr(import_inbox, "INBOX_POLL", 0.01)
    monkeypatch.setattr(import_inbox, "IMPORT_RETRY", Backoff(0.01, 0.01))
    inbox = import_inbox.inbox_dir(settings.layout)
    inbox.mkdir(parents=True, exist_ok=True)
    stuck = inbox / import_inbox.partial_name(import_inbox.inbox_name(_gone_pid(), 1))
    stuck.write_text('{"session": "s"}\n')
    old = time.time() - import_inbox.PARTIAL_STALE - 60
    os.utime(stuck, (old, old))
    real_unlink = os.unlink

    def unlink(path: str, *args: object, **kwargs: object) -> None:
        if os.fspath(path) == str(stuck):
            raise PermissionError(errno.EACCES, "Permission denied", str(stuck))
        real_unlink(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "unlink", unlink)
    queued, _ = import_inbox.write(settings.layout, turns_of([json.dumps(x) for x in LINES[:1]])[0])
    system = MemorySystem(settings)
    await system.start()
    try:
        for _ in range(300):
            if not queued.exists():
                break
            await asyncio.sleep(0.01)
        assert not queued.exists() and stuck.exists()
    finally:
        await system.stop()


@pytest.mark.usefixtures("workspace_env")
async def test_the_inbox_outlives_a_failure_whose_report_fails_too_and_healthz_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a full disk the report of a failed import failed as well, from inside the `except`: it ended
    the inbox's task for good, nothing was applied until a restart, and memory's status stayed ok.
    An unreadable inbox folder ended it the same way."""
    import errno

    settings = lexical(tmp_path)
    monkeypatch.setattr(import_inbox, "INBOX_POLL", 0.01)
    monkeypatch.setattr(import_inbox, "IMPORT_RETRY", Backoff(0.01, 0.01))
    # The full disk lasts until the test frees it: at a retry every 0.01 s the file must not be given up on
    # meanwhile (a loaded machine's status() took long enough for the eighth attempt to set it aside).
    monkeypatch.setattr(import_inbox, "MAX_ATTEMPTS", 1_000_000)
    real_report, real_files = import_inbox.report, import_inbox.inbox_files
    disk = {"full": True, "unreadable": 1}

    def report(path: Path, p: import_inbox.Progress) -> None:
        if disk["full"]:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_report(path, p)

    def inbox_files(layout: object, ending: str = import_inbox.SUFFIX) -> list[Path]:
        if disk["unreadable"] and ending == import_inbox.SUFFIX:  # the task's look for files to apply
            disk["unreadable"] -= 1
            raise OSError(errno.EIO, "Input/output error")
        return real_files(layout, ending)  # type: ignore[arg-type]

    monkeypatch.setattr(import_inbox, "report", report)
    monkeypatch.setattr(import_inbox, "inbox_files", inbox_files)
    system = MemorySystem(settings)
    await system.start()
    try:
        turns, _ = turns_of([json.dumps(x) for x in LINES])
        path, _ = import_inbox.write(settings.layout, turns)
        for _ in range(500):
            if (await system.status())["degraded"]:  # the unreadable inbox once, then the file's attempts, twice
                break
            await asyncio.sleep(0.01)
        status = await system.status()
        assert status["degraded"] is True
        assert status["recall"]["import"]["degraded"] is True and "No space left" in status["recall"]["import"]["error"]
        disk["full"] = False  # space freed: the same task applies the file
        for _ in range(500):
            if not path.exists() and (await system.status())["recall"]["import"] is None:
                break
            await asyncio.sleep(0.01)
        assert not path.exists() and (await system.status())["degraded"] is False
        assert (await system.status())["recall"]["import"] is None
        assert await system.transcript.call(lambda t: t.counts()["total"]) == 3
    finally:
        await system.stop()


@contextlib.contextmanager
def _importing_while_held(settings: Settings, tmp_path: Path, role: str = WriterLock.SERVER) -> Iterator[
        tuple[Path, WriterLock, threading.Thread, list[int]]]:
    """`memory import` run in a thread while this test holds the writer lock, as a server does (or as `role`
    does): the inbox file it wrote, the lock, the thread and its exit status once it ends. The lock is let go
    after."""
    holder = WriterLock(settings.layout.memory_lock, role)
    holder.acquire()
    source = jsonl(tmp_path / "past.jsonl", bad=False)
    result: list[int] = []
    command = threading.Thread(target=lambda: result.append(_cli(settings, "import", str(source))), daemon=True)
    command.start()
    try:
        for _ in range(500):
            if found := import_inbox.inbox_files(settings.layout):
                break
            time.sleep(0.01)
        (path,) = found
        yield path, holder, command, result
    finally:
        holder.release()


def test_the_writer_lock_says_who_holds_it(tmp_path: Path) -> None:
    """A holder's note stayed in the lock file after it let go: the next holder, between its flock and its
    note, was taken for the one gone (a waiting import named a pid that was no process)."""
    lock_file = tmp_path / ".writer.lock"
    lock, other = (WriterLock(lock_file, role) for role in (WriterLock.IMPORT, WriterLock.REBUILD))
    assert lock.holder() is None and lock.nobody_holds()
    with other:
        assert lock.holder() == (os.getpid(), WriterLock.REBUILD) and not lock.nobody_holds()
    assert lock.holder() is None and lock_file.read_text() == ""  # its note is cleared as it lets go
    with WriterLock(lock_file, WriterLock.SERVER):
        os.truncate(lock_file, 0)  # an earlier version's holder: it names nobody; /proc/locks gives its pid
        assert lock.holder() == (os.getpid(), None) and lock.holder_checked() == (os.getpid(), None)
        lock_file.write_text(f"{_gone_pid()} {WriterLock.IMPORT}\n")  # a killed holder's note, before this one's
        assert lock.holder() == (os.getpid(), None)


def _gone_pid() -> int:
    """A pid that was a process a moment ago and is none now."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


@pytest.mark.usefixtures("workspace_env")
def test_a_server_start_that_lands_in_a_probes_instant_takes_the_lock_and_a_refusal_names_the_holder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A waiting import takes the lock for an instant to see that it is free; a server's
    start had one try and was refused ("lock held") if it landed then. It tries for about a second."""
    from sprite_os.commands import main as commands
    from sprite_os.errors import LockHeld
    from sprite_os.isolation import probe

    class Reached(Exception):
        pass

    def resolve(*_: object) -> None:
        raise Reached  # past the lock: the start goes on

    monkeypatch.setattr(probe, "resolve", resolve)
    settings = lexical(tmp_path)
    settings.layout.ensure()
    prober = WriterLock(settings.layout.memory_lock, WriterLock.IMPORT)
    prober.acquire()
    threading.Timer(0.2, prober.release).start()  # the probe's instant (longer here)
    with pytest.raises(Reached):
        commands._serve(settings)
    with WriterLock(settings.layout.memory_lock, WriterLock.IMPORT), pytest.raises(LockHeld) as refused:
        commands._serve(settings)
    assert f"held by `sprite-os memory import` (pid {os.getpid()})" in str(refused.value)


def test_every_taker_outwaits_a_probes_instant_a_refusal_names_the_holder_and_a_probe_tries_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the server's start tried the lock for a second: `memory rebuild`, `migrate-v1` and a memory system's
    start that landed in a waiting import's instant take (nobody_holds) were refused. acquire() tries for the
    bound and, refused, names the holder; the probe itself tries once, never standing in a taker's way longer."""
    from sprite_os import fsutil
    from sprite_os.errors import LockHeld

    path = tmp_path / "memory.lock"
    other = WriterLock(path, WriterLock.IMPORT)
    other.acquire()
    threading.Timer(0.05, other.release).start()  # a probe's instant (longer here), well within the bound
    with WriterLock(path, WriterLock.REBUILD) as taker:
        assert taker.held
    monkeypatch.setattr(fsutil, "LOCK_TRIES", 10)  # 0.2 s
    with WriterLock(path, WriterLock.IMPORT):
        started = time.monotonic()
        with pytest.raises(LockHeld) as refused:
            WriterLock(path, WriterLock.MIGRATE).acquire()
        assert time.monotonic() - started >= 9 * fsutil.LOCK_TRY  # it tried again before it gave up
        assert f"held by `sprite-os memory import` (pid {os.getpid()})" in str(refused.value)
        monkeypatch.setattr(fsutil, "LOCK_TRY", 1.0)  # a probe that tried again would take 9 s
        monkeypatch.setattr(WriterLock, "_flocked_by", lambda _: None)  # an overlay: /proc/locks shows nobody
        started = time.monotonic()
        assert not WriterLock(path, WriterLock.IMPORT).nobody_holds()
        assert time.monotonic() - started < 5.0  # one try, not ten a second apart (well under their 9 s)


@pytest.mark.usefixtures("workspace_env")
def test_an_import_queued_behind_another_import_waits_for_it_then_records_its_turns(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """An import that found another import applying the inbox was told after 15 s that "a process that takes
    no imports" held the workspace, and left its turns queued for a server that may never start (exit 3).
    It says another import is running and for how long, waits, and records its turns itself once it is over."""
    from sprite_os.commands import memory_import

    settings = lexical(tmp_path)
    settings.layout.ensure()
    monkeypatch.setattr(memory_import, "TAKE_WAIT", 0.2)
    with _importing_while_held(settings, tmp_path, WriterLock.IMPORT) as (path, holder, command, result):
        time.sleep(0.8)  # past TAKE_WAIT, several times: the other import is still at work
        assert command.is_alive() and not result
        holder.release()  # it is over; this file was queued after it looked
        command.join(20)
        assert result == [0]
    out = capsys.readouterr()
    said = [line for line in out.err.splitlines() if line.startswith("another import")]
    assert len(said) >= 2 and f"`sprite-os memory import` (pid {os.getpid()})" in said[0] and "0 s so far" in said[0]
    assert "takes no imports" not in out.out + out.err
    assert "imported 3 turns from 2 sessions (0 already recorded, 0 bad lines); searchable now" in out.out
    assert not path.exists() and not list(import_inbox.inbox_dir(settings.layout).iterdir())  # no report left
    db = TranscriptDB(settings.layout.transcript_db)
    assert db.counts()["total"] == 3
    db.close()


@pytest.mark.usefixtures("workspace_env")
def test_an_import_another_import_records_is_told_so_by_name(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The other import, queued first, applies this one's file too (it was in the inbox when it looked)."""
    settings = lexical(tmp_path)
    settings.layout.ensure()
    with _importing_while_held(settings, tmp_path, WriterLock.IMPORT) as (path, _holder, command, result):
        import_inbox.report(path, import_inbox.Progress(path.name, 3, applied=1, added=1, at=time.time()))
        time.sleep(0.3)
        import_inbox.finish(path, import_inbox.Progress(path.name, 3, applied=3, added=3))
        command.join(20)
        assert result == [0]
    out = capsys.readouterr()
    assert f"`sprite-os memory import` (pid {os.getpid()}) is recording the turns" in out.err
    assert f"imported 3 turns from 2 sessions (0 already recorded, 0 bad lines); `sprite-os memory import` (pid " \
           f"{os.getpid()}) indexes them before it ends" in out.out
    assert not list(import_inbox.inbox_dir(settings.layout).iterdir())


@pytest.mark.usefixtures("workspace_env")
def test_an_import_that_applies_another_waiting_imports_file_leaves_it_its_report(tmp_path: Path) -> None:
    """An import applying the inbox removed every file's done report: another import waiting for its file
    (queued while this one held the lock) then never saw it applied, and took the server for stopped."""
    settings = lexical(tmp_path)
    settings.layout.ensure()
    turns, _ = turns_of([json.dumps(x) for x in LINES[:1]])
    queued, _ = import_inbox.write(settings.layout, turns)
    theirs = queued.with_name(import_inbox.inbox_name(1) + import_inbox.SUFFIX)  # pid 1's: it lives
    gone = queued.with_name(import_inbox.inbox_name(_gone_pid()) + import_inbox.SUFFIX)
    queued.rename(theirs)
    import_inbox.write(settings.layout, turns)[0].rename(gone)
    assert _cli(settings, "import", str(jsonl(tmp_path / "past.jsonl", bad=False))) == 0
    left = sorted(p.name for p in import_inbox.inbox_dir(settings.layout).iterdir())
    # Both kept for their waiting commands: a pid that is no process here may be one in another pid namespace.
    assert left == sorted(import_inbox.progress_path(p, import_inbox.DONE).name for p in (theirs, gone))
    day = time.time() + import_inbox.DONE_STALE + 1  # a day on, the server's start sweeps them
    assert {p.name for p in import_inbox.sweep_inbox(settings.layout, now=day)} == set(left)


@pytest.mark.usefixtures("workspace_env")
def test_an_import_whose_file_another_writer_applied_without_a_report_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An import whose file another writer applied and whose report was gone (removed by an import in another
    pid namespace, by an earlier version) ended in an AssertionError after its turns were recorded."""
    from sprite_os.commands import memory_import

    settings = lexical(tmp_path)
    settings.layout.ensure()
    turns, _ = turns_of([json.dumps(x) for x in LINES[:1]])
    queued, _ = import_inbox.write(settings.layout, turns)
    queued.unlink()  # applied by the other writer, its report gone
    memory_import._apply_here(settings, queued, {"s1"}, 0)
    assert "recorded by another writer" in capsys.readouterr().out


@pytest.mark.usefixtures("workspace_env")
@pytest.mark.parametrize("role", [WriterLock.REBUILD, WriterLock.ROLLBACK])
def test_an_import_behind_a_rebuild_says_so_and_leaves_its_turns_queued(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], role: str) -> None:
    """A holder that takes no imports (a rebuild; a rollback that holds on past TAKE_WAIT) is named as one:
    a rollback's was said to "have not taken the turns", as if it might."""
    from sprite_os.commands import memory_import

    settings = lexical(tmp_path)
    settings.layout.ensure()
    monkeypatch.setattr(memory_import, "TAKE_WAIT", 0.2)
    with _importing_while_held(settings, tmp_path, role) as (path, _holder, command, result):
        command.join(20)
        assert result == [3]
    out = capsys.readouterr().out
    assert f"held by `sprite-os {role}` (pid {os.getpid()}), which takes no imports: they wait in {path}" in out
    assert import_inbox.inbox_files(settings.layout) == [path]


@pytest.mark.usefixtures("workspace_env")
def test_an_import_behind_a_command_that_lets_go_soon_applies_its_turns_itself(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A `memory rollback` holds the writer lock for its write, a moment: an import that met it there, then
    found the lock free, said "the server stopped before it took them" (exit 1), its turns left for a start
    that may never come. A holder that is not a server and lets go is like another import that did: this
    command takes the lock and applies the turns."""
    settings = lexical(tmp_path)
    settings.layout.ensure()
    with _importing_while_held(settings, tmp_path, WriterLock.ROLLBACK) as (_path, holder, command, result):
        time.sleep(0.3)  # the import has seen who holds it
        holder.release()
        command.join(20)
        assert result == [0]
    said = capsys.readouterr()
    assert "stopped before it took them" not in said.out + said.err and "imported 3 turns" in said.out, said
    assert import_inbox.inbox_files(settings.layout) == []


@pytest.mark.usefixtures("workspace_env")
def test_an_import_that_waited_behind_another_gives_a_server_that_wins_the_lock_its_own_take_wait(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The take-wait counted from the command's start: after a long wait behind another import, a server that
    won the lock was told at its first look that it "has not taken the turns", and the file left for a next
    start (exit 3) while the server, still starting, was about to take it. It counts from the new holder."""
    from sprite_os.commands import memory_import

    settings = lexical(tmp_path)
    settings.layout.ensure()
    monkeypatch.setattr(memory_import, "TAKE_WAIT", 0.6)
    with _importing_while_held(settings, tmp_path, WriterLock.IMPORT) as (path, _holder, command, result):
        time.sleep(1.0)  # past TAKE_WAIT behind the other import
        # The other import lets go and a server wins the lock at once (its note, in the same held lock).
        Path(settings.layout.memory_lock).write_text(f"{os.getpid()} {WriterLock.SERVER}\n")
        time.sleep(0.3)  # the server still starting: within its TAKE_WAIT
        assert command.is_alive() and not result
        import_inbox.finish(path, import_inbox.Progress(path.name, 3, applied=3, added=3))  # it takes them
        command.join(20)
        assert result == [0]
    assert "imported when the server next starts" not in capsys.readouterr().out


@pytest.mark.usefixtures("workspace_env")
@pytest.mark.parametrize("server", ["gone", "stuck"])
def test_an_import_through_a_server_gives_up_when_the_server_is_gone_or_records_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], server: str) -> None:
    """The command waited for the server with no bound: a server killed after taking the file, or one
    whose attempts kept failing, held it forever. It exits 1, the file left queued."""
    from sprite_os.commands import memory_import

    settings = lexical(tmp_path)
    settings.layout.ensure()
    monkeypatch.setattr(memory_import, "STALL_WAIT", 0.5 if server == "stuck" else 60.0)
    monkeypatch.setattr(import_inbox, "IMPORT_RETRY", Backoff(0.1, 0.1))  # after a failure, a report within this
    with _importing_while_held(settings, tmp_path) as (path, holder, command, result):
        # The server takes it and records one chunk, then is killed, or fails on every attempt after.
        import_inbox.report(path, import_inbox.Progress(path.name, 3, applied=1, added=1, at=time.time()))
        time.sleep(0.3)
        if server == "gone":
            holder.release()
        else:
            import_inbox.report(path, import_inbox.Progress(path.name, 3, applied=0, error="OSError(28)"))
        command.join(10)
        assert result == [1]
    err = capsys.readouterr().err
    assert "gave up waiting" in err and str(path) in err
    assert ("the server (pid " if server == "gone" else "recorded none of them for 0 s") in err
    assert "stopped after 1 of 3" in err if server == "gone" else True
    assert import_inbox.inbox_files(settings.layout) == [path]  # queued: the next server applies it


@pytest.mark.usefixtures("workspace_env")
def test_an_import_through_a_server_waits_while_its_failing_attempts_report_until_the_file_is_set_aside(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Attempts resume where they stopped, so one that fails at the same chunk never moves the count, and
    the waits between them grow past STALL_WAIT: the command gave up ("recorded none of them") minutes
    before the server set the file aside, and told the person it stays queued. Each failed attempt's
    report is life now, and after one the command waits out the retry's longest wait on top."""
    from sprite_os.commands import memory_import

    settings = lexical(tmp_path)
    settings.layout.ensure()
    monkeypatch.setattr(memory_import, "STALL_WAIT", 0.3)
    monkeypatch.setattr(import_inbox, "IMPORT_RETRY", Backoff(0.1, 0.6))
    with _importing_while_held(settings, tmp_path) as (path, _holder, command, result):
        for _ in range(3):  # failed attempts at the same chunk, each after a wait longer than STALL_WAIT
            import_inbox.report(path, import_inbox.Progress(path.name, 3, applied=1, added=1, error="OSError(28)",
                                                            at=time.time()))
            time.sleep(0.5)
        aside = path.with_name(path.name + import_inbox.SET_ASIDE_SUFFIX)
        path.rename(aside)  # the server gives up on it, as after MAX_ATTEMPTS
        command.join(10)
        assert result == [1]
        aside.unlink()
    err = capsys.readouterr().err
    assert "the server gave up after" in err and str(aside) in err and "recorded none" not in err


@pytest.mark.usefixtures("workspace_env")
async def test_a_file_that_keeps_failing_is_resumed_backed_off_then_set_aside_for_the_operator(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A file the server failed to apply was applied again from its first turn every ~6 s, forever (each
    chunk a synced transaction on transcript.db's thread, each attempt a traceback). A retry resumes where
    the last one got to, after the one backoff policy's growing wait, and after MAX_ATTEMPTS the file is set
    aside under a name `memory status` shows; the command waiting on it says so and exits 1."""

    settings = lexical(tmp_path)
    monkeypatch.setattr(import_inbox, "INBOX_POLL", 0.01)
    monkeypatch.setattr(import_inbox, "APPLY_CHUNK", 1)
    monkeypatch.setattr(import_inbox, "MAX_ATTEMPTS", 3)
    waits: list[int] = []

    class Waits:
        max = 0.05  # the longest wait, which the waiting command reads when a report says an attempt failed

        def delay(self, failures: int, rand: float) -> float:
            waits.append(failures)
            return 0.05

    monkeypatch.setattr(import_inbox, "IMPORT_RETRY", Waits())
    applied: list[str] = []
    broken = {"on": True}
    real = TranscriptDB.import_turns

    def import_turns(self: TranscriptDB, turns: list[ImportedTurn]) -> list[int | None]:
        applied.extend(t.user_message[:6] for t in turns)
        if broken["on"] and "PIN" in turns[0].user_message:
            raise ValueError("a turn transcript.db refuses")
        return real(self, turns)

    monkeypatch.setattr(TranscriptDB, "import_turns", import_turns)
    system = MemorySystem(settings)
    await system.start()
    try:
        source = jsonl(tmp_path / "past.jsonl", bad=False)
        result: list[int] = []
        command = threading.Thread(target=lambda: result.append(_cli(settings, "import", str(source))))
        command.start()
        while command.is_alive():
            await asyncio.sleep(0.05)
        assert result == [1]
        # The first attempt applied two turns; each retry took up the third alone, after a growing wait.
        assert applied == ["We ado", "Biscui", "My PIN", "My PIN", "My PIN"]
        assert waits == [1, 2]  # the backoff's failures in a row: its wait grows with them
        (aside,) = import_inbox.inbox_files(settings.layout, import_inbox.SET_ASIDE_ENDING)
        assert not import_inbox.inbox_files(settings.layout) and aside.name.endswith(".jsonl.failed")
        err = capsys.readouterr().err
        assert "the server gave up after 3 failed attempts" in err and str(aside) in err and "2 of 3" in err
        assert (await system.status())["degraded"] is True  # until the operator deals with it
        assert (await system.status())["recall"]["import"]["set_aside"] == [aside.name]
        broken["on"] = False
        aside.rename(aside.with_name(aside.name.removesuffix(".failed")))  # the operator applies it again
        for _ in range(500):
            if not import_inbox.inbox_files(settings.layout) and (await system.status())["recall"]["import"] is None:
                break
            await asyncio.sleep(0.01)
        assert await system.transcript.call(lambda t: t.counts()["total"]) == 3
        assert (await system.status())["degraded"] is False
    finally:
        await system.stop()


def test_the_import_retry_waits_grow_by_the_one_backoff_policy() -> None:
    assert isinstance(import_inbox.IMPORT_RETRY, Backoff)
    assert [import_inbox.IMPORT_RETRY.delay(n, 0.5) for n in (1, 2, 3, 20)] == [5.0, 10.0, 20.0, 270.0]  # at the top, the jitter only shortens


@pytest.mark.usefixtures("workspace_env")
def test_memory_status_names_an_import_the_server_set_aside(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    settings = lexical(tmp_path)
    settings.layout.ensure()
    turns, _ = turns_of([json.dumps(x) for x in LINES])
    path, _ = import_inbox.write(settings.layout, turns)
    import_inbox.report(path, import_inbox.Progress(path.name, 3, applied=2, error="OSError(28, 'No space left')"))
    path.rename(path.with_name(path.name + ".failed"))
    assert _cli(settings, "status") == 0
    out = capsys.readouterr().out
    assert f"FAILED: the server gave up on .os/state/imports/{path.name}.failed" in out
    assert "No space left" in out and "2 of 3 turns recorded" in out and f"rename it back to {path.name}" in out


@pytest.mark.usefixtures("workspace_env")
@pytest.mark.parametrize("waiting", [False, True])
def test_memory_status_says_whether_auto_recall_is_on_whatever_the_inbox_holds(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], waiting: bool) -> None:
    """Its last line went missing whenever no server answered for a waiting import: the usual case."""
    settings = lexical(tmp_path)
    settings.layout.ensure()
    if waiting:  # a file waiting, nobody holding the lock: nobody to ask
        import_inbox.write(settings.layout, turns_of([json.dumps(x) for x in LINES])[0])
    assert _cli(settings, "status") == 0
    assert f"  auto-recall      {'on' if settings.auto_recall else 'off'}" in capsys.readouterr().out.splitlines()


@pytest.mark.parametrize(("answers", "named"), [("holder", True), ("holder", False), ("nobody", True),
                                                 ("another", True), ("another", False)])
def test_memory_status_asks_the_server_about_an_import_whose_failure_it_could_not_report(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], answers: str,
        named: bool) -> None:
    """On a full disk the report of a failed attempt fails too: `memory status` showed the file as waiting
    for the server, all well, while /healthz said degraded. It asks the server that holds the lock now, and
    says so when it does not answer. A server that started on a full disk wrote no note: it is asked all
    the same. The answer counts only from the process holding the lock: the configured port may be another
    workspace's server."""
    import http.server
    import socket

    settings = lexical(tmp_path)
    settings.layout.ensure()
    turns, _ = turns_of([json.dumps(x) for x in LINES])
    path, _ = import_inbox.write(settings.layout, turns)  # no report of it: it could not be written
    error = "OSError(28, 'No space left on device')"
    body = json.dumps({"status": "degraded", "pid": os.getpid() if answers == "holder" else 1, "memory": {
        "recall": {"import": {"failing": 3, "error": error, "degraded": True}}}}).encode()

    class Healthz(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    with socket.socket() as probe:  # a port nothing listens on, when the server does not answer
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = http.server.HTTPServer(("127.0.0.1", 0), Healthz) if answers != "nobody" else None
    if server is not None:
        port = server.server_address[1]
        threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("SPRITE_OS_PORT", str(port))
    try:
        with WriterLock(settings.layout.memory_lock, WriterLock.SERVER):
            if not named:
                os.truncate(settings.layout.memory_lock, 0)  # its note refused by a full disk
            assert _cli(settings, "status") == 0
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
    out = capsys.readouterr().out
    assert f"{path.name}: 3 turns, waiting for the workspace's writer" in out
    who = f"{'the server' if named else 'a process that did not say what it is'} (pid {os.getpid()}) holds the workspace"
    failing = f"FAILING, as the server says (3 attempts in a row; its report could not be written): {error}"
    if answers == "holder":
        assert failing in out
    elif answers == "another":
        assert failing not in out and f"{who}, but the server on port {port} is another (pid 1)" in out
    else:
        assert f"{who} but /healthz on port {port} did not answer" in out


@pytest.mark.usefixtures("workspace_env")
@pytest.mark.parametrize("held", [False, True])
def test_memory_status_never_takes_the_writer_lock_nor_writes_in_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], held: bool) -> None:
    """To learn whether a server held the lock while an import waited, `memory status` took the lock for a
    moment and wrote its own note in it: a server starting then exited (the workspace held), and a user who
    may read the workspace but not write the lock file got a traceback. It only looks now."""
    import fcntl

    settings = lexical(tmp_path)
    settings.layout.ensure()
    import_inbox.write(settings.layout, turns_of([json.dumps(x) for x in LINES])[0])
    lock_file = Path(settings.layout.memory_lock)
    lock_file.unlink(missing_ok=True)
    monkeypatch.setenv("SPRITE_OS_PORT", "1")  # nothing answers there
    holder = WriterLock(lock_file, WriterLock.SERVER)
    if held:
        holder.acquire()
    note = lock_file.read_bytes() if held else None
    taken: list[str] = []
    flock = fcntl.flock

    def watched(fd: int, operation: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}") == str(lock_file):
            taken.append(f"flock {operation}")
        flock(fd, operation)

    monkeypatch.setattr(fcntl, "flock", watched)
    try:
        assert _cli(settings, "status") == 0
        after = lock_file.read_bytes() if lock_file.exists() else None
    finally:
        holder.release()
    assert taken == [] and after == note  # not taken, not made, not written
    assert ("holds the workspace" in capsys.readouterr().out) == held


@pytest.mark.usefixtures("workspace_env")
def test_an_import_through_a_server_waits_for_an_attempt_that_starts_over(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Only a count above the best seen was progress: a server whose attempt failed late and that started
    the file over (at 0) was at work, but the command saw nothing new until it caught up, and gave up on
    it as "busy or stuck". Any move of the count is progress now."""
    from sprite_os.commands import memory_import

    settings = lexical(tmp_path)
    settings.layout.ensure()
    monkeypatch.setattr(memory_import, "STALL_WAIT", 1.0)
    with _importing_while_held(settings, tmp_path) as (path, _holder, command, result):
        # Two turns recorded, then an attempt from the start that moves on every 0.4 s (within STALL_WAIT each
        # time, but past it before the count is above 2 again).
        for applied in (2, 0, 1, 2):
            import_inbox.report(path, import_inbox.Progress(path.name, 3, applied=applied, added=applied,
                                                            at=time.time()))
            time.sleep(0.4)
        import_inbox.finish(path, import_inbox.Progress(path.name, 3, applied=3, added=3))
        command.join(10)
        assert result == [0]
    assert "imported 3 turns from 2 sessions" in capsys.readouterr().out


@pytest.mark.usefixtures("workspace_env")
async def test_a_memory_systems_start_waits_for_a_held_lock_off_the_event_loop(tmp_path: Path) -> None:
    """A start that finds the lock held tries again for about a second: on the event loop, those tries
    held every other task up for that second."""
    from sprite_os.errors import LockHeld

    settings = lexical(tmp_path)
    settings.layout.ensure()
    async with loop_ticks() as ticks:
        with WriterLock(settings.layout.memory_lock, WriterLock.IMPORT):
            started = time.monotonic()
            with pytest.raises(LockHeld):
                await MemorySystem(settings).start()
            waited = time.monotonic() - started
    assert waited > 0.5  # it did try again
    assert ticks.count >= 10  # and the loop went on meanwhile (none at all when the tries held it)
