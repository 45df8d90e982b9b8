"""The console's memory requests, answered by MemoryConsole against real stores and files
(no server, no browser): each request, bad input, forgetting and its audit."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from devkit.harness import make_settings
from sprite_os.commands.main import main as cli
from sprite_os.console import memory_frames as pm
from sprite_os.console.memory_api import MemoryConsole
from sprite_os.database import read_only
from sprite_os.memory import import_inbox
from sprite_os.memory.curation.rebuild import read_before
from sprite_os.memory.forget.learnings import forget_again, forgotten_keys
from sprite_os.memory.memory_store import MemoryDB, NewLearning
from sprite_os.memory.recall.searcher import RecallHit
from sprite_os.memory.system import MemorySystem
from sprite_os.memory.transcript_store import NewObservation, TranscriptDB
from sprite_os.spending import day_start

NOW = 1_800_000_000.0  # a fixed clock: "today" starts at day_start(NOW)


@pytest.fixture
async def system(tmp_path: Path) -> AsyncIterator[MemorySystem]:
    settings = make_settings(tmp_path / "workspace", "http://127.0.0.1:9")
    settings.layout.ensure()
    memory = MemorySystem(settings)
    yield memory
    await memory.curator.close()
    await asyncio.gather(memory.transcript.close(), memory.memory.close())


@pytest.fixture
def console(system: MemorySystem) -> MemoryConsole:
    return MemoryConsole(system, clock=lambda: NOW)


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


async def seed(system: MemorySystem) -> list[int]:
    """Two recorded turns of session s1 and one batch that learned three things from them."""
    def turns(t: TranscriptDB) -> list[int]:
        return [t.append(NewObservation(timestamp=NOW - 60 + n, session_id="s1", sequence_num=n,
                                        user_message=f"message {n}", agent_response=f"answer {n}",
                                        tool_calls_json='[{"name": "Bash", "input": {"command": "ls"}, '
                                                        '"output": "a.txt", "is_error": false}]'))
                or 0 for n in (1, 2)]

    ids = await system.transcript.call(turns)
    learned = [NewLearning("FACT", "The user's name is Ada Lovelace", "s1", ids[0]),
               NewLearning("PREFERENCE", "Ada likes tea in the morning", "s1", ids[1]),
               NewLearning("ACTION", "Remind Ada about the tea order", "s1", None)]
    await system.memory.call(lambda m: m.commit_batch(
        trigger="t", observation_ids=ids, model="claude-haiku-4-5", input_tokens=100, output_tokens=20,
        cost_usd=0.0002, learnings=learned, file_updates={}, base_hashes={}))
    return ids


async def ask(console: MemoryConsole, request: pm.MemoryRequest) -> pm.MemoryReply:
    reply = await console.handle(request)
    assert reply.request_id == request.request_id
    return reply


async def failure(console: MemoryConsole, request: pm.MemoryRequest) -> pm.RequestFailed:
    with pytest.raises(pm.RequestFailed) as info:
        await console.handle(request)
    return info.value


# ---------------------------------------------------------------- files


async def test_files_list_all_six_with_their_limits(console: MemoryConsole, system: MemorySystem) -> None:
    system.files.write("user.md", "# User\n- Name: Ada\n", source="batch-1")
    reply = await ask(console, pm.MemoryFilesRequest(request_id="r1"))
    assert isinstance(reply, pm.MemoryFilesResult)
    files = {f.name: f for f in reply.files}
    assert list(files) == ["soul.md", "os.md", "tools.md", "files.md", "user.md", "context.md"]
    user = files["user.md"]
    assert (user.lines, user.max_lines, user.versions, user.owner, user.editable) == (2, 200, 1, "daemon", True)
    assert user.sha256 == sha("# User\n- Name: Ada\n")
    assert (files["soul.md"].owner, files["soul.md"].editable, files["soul.md"].lines) == ("deploy", False, 0)


async def test_a_version_comes_with_its_diff_against_the_one_before(console: MemoryConsole,
                                                                    system: MemorySystem) -> None:
    system.files.write("user.md", "# User\n- Name: Ada\n", source="batch-1")
    system.files.write("user.md", "# User\n- Name: Ada Lovelace\n- City: London\n", source="batch-2")
    detail = await ask(console, pm.MemoryFileRequest(request_id="r", name="user.md"))
    assert isinstance(detail, pm.MemoryFileResult)
    assert [(v.number, v.source, v.lines) for v in detail.history] == [(1, "batch-1", 2), (2, "batch-2", 3)]
    second = await ask(console, pm.MemoryVersionRequest(request_id="r", name="user.md", number=2))
    assert isinstance(second, pm.MemoryVersionResult) and second.previous == 1
    assert second.diff.splitlines()[:2] == ["--- user.md@1", "+++ user.md@2"]
    assert "-- Name: Ada" in second.diff.splitlines() and "+- City: London" in second.diff.splitlines()
    first = await ask(console, pm.MemoryVersionRequest(request_id="r", name="user.md", number=1))
    assert isinstance(first, pm.MemoryVersionResult) and first.previous is None and "+# User" in first.diff
    missing = await failure(console, pm.MemoryVersionRequest(request_id="r", name="user.md", number=9))
    assert missing.code == "not_found"


async def test_a_persons_edit_is_a_version_and_in_the_audit(console: MemoryConsole, system: MemorySystem) -> None:
    system.files.write("user.md", "# User\n", source="batch-1")
    reply = await ask(console, pm.MemoryEditRequest(request_id="e", name="user.md", text="# User\n- Pronouns: she",
                                                    base_sha256=sha("# User\n")))
    assert isinstance(reply, pm.MemoryEditResult)
    assert system.files.read("user.md") == "# User\n- Pronouns: she\n"  # a final newline is added
    assert (reply.version.number, reply.version.source) == (2, "person-edit")
    assert reply.file.sha256 == sha("# User\n- Pronouns: she\n")
    audit = await ask(console, pm.MemoryAuditRequest(request_id="a"))
    assert isinstance(audit, pm.MemoryAuditResult)
    [entry] = audit.entries
    assert (entry.action, entry.file, entry.at, entry.detail) == ("edit", "user.md", NOW, "saved as version 2")


async def test_an_edit_begun_before_the_daemons_rewrite_is_refused(console: MemoryConsole,
                                                                   system: MemorySystem) -> None:
    system.files.write("user.md", "# User\n", source="batch-1")
    started_from = sha("# User\n")
    system.files.write("user.md", "# User\n- Name: Ada\n", source="batch-2")  # the daemon, meanwhile
    error = await failure(console, pm.MemoryEditRequest(request_id="e", name="user.md", text="# Mine\n",
                                                        base_sha256=started_from))
    assert error.code == "file_changed" and "nothing was saved" in error.message
    assert "the memory daemon rewrote it" in error.message
    assert system.files.read("user.md") == "# User\n- Name: Ada\n"
    assert len(system.files.history("user.md")) == 2


async def test_an_edit_overtaken_by_the_persons_own_other_tab_does_not_blame_the_daemon(
        console: MemoryConsole, system: MemorySystem) -> None:
    system.files.write("user.md", "# User\n", source="batch-1")
    await ask(console, pm.MemoryEditRequest(request_id="e1", name="user.md", text="# From tab one\n",
                                            base_sha256=sha("# User\n")))
    error = await failure(console, pm.MemoryEditRequest(request_id="e2", name="user.md", text="# From tab two\n",
                                                        base_sha256=sha("# User\n")))
    assert error.code == "file_changed" and "another tab or device" in error.message
    assert "daemon" not in error.message


async def test_an_edit_the_disk_did_not_confirm_says_saved_and_its_retry_is_not_blamed_on_another_tab(
        console: MemoryConsole, system: MemorySystem, monkeypatch: pytest.MonkeyPatch) -> None:
    """The folder's fsync failed after the file was renamed into place: the answer said the edit
    failed, and the person's Save again (the same base) was refused as "saved from another tab or
    device". Now: saved, but not confirmed, and the Save again is answered as saved."""
    import os

    from devkit.faults import FsyncSpy

    system.files.write("user.md", "# User\n", source="batch-1")
    spy = FsyncSpy()
    monkeypatch.setattr(os, "fsync", spy)
    spy.failing.add(system.files.path("user.md").parent)
    edit = pm.MemoryEditRequest(request_id="e1", name="user.md", text="# User\n- Name: Ada\n",
                                base_sha256=sha("# User\n"))
    error = await failure(console, edit)
    assert error.code == "not_durable"
    assert "user.md was saved as version 2, but the disk reported an error" in error.message
    assert system.files.read("user.md") == "# User\n- Name: Ada\n"
    again = await ask(console, pm.MemoryEditRequest(request_id="e2", name="user.md", text=edit.text,
                                                    base_sha256=edit.base_sha256))
    assert isinstance(again, pm.MemoryEditResult) and again.version.number == 2
    assert len(system.files.history("user.md")) == 2  # no second version of the same Save
    audit = await ask(console, pm.MemoryAuditRequest(request_id="a"))
    assert isinstance(audit, pm.MemoryAuditResult)
    assert [e.detail for e in audit.entries] == ["saved as version 2"]  # one edit, one row


async def test_a_rollback_the_disk_did_not_confirm_is_answered_as_an_edit_is(
        console: MemoryConsole, system: MemorySystem, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rollback whose folder fsync failed answered `not_durable` with no audit row (the file had
    changed all the same), and the same click again made yet another version of the same text."""
    import os

    from devkit.faults import FsyncSpy

    system.files.write("user.md", "# User\n", source="batch-1")
    system.files.write("user.md", "# User\n- Name: Ada\n", source="batch-2")
    spy = FsyncSpy()
    monkeypatch.setattr(os, "fsync", spy)
    spy.failing.add(system.files.path("user.md").parent)
    error = await failure(console, pm.MemoryRollbackRequest(request_id="r1", name="user.md", number=1))
    assert error.code == "not_durable"
    assert "user.md was saved as version 3, but the disk reported an error" in error.message
    assert system.files.read("user.md") == "# User\n"
    again = await ask(console, pm.MemoryRollbackRequest(request_id="r2", name="user.md", number=1))
    assert isinstance(again, pm.MemoryRollbackResult) and again.version.number == 3
    assert len(system.files.history("user.md")) == 3  # no second version of the same rollback
    audit = await ask(console, pm.MemoryAuditRequest(request_id="a"))
    assert isinstance(audit, pm.MemoryAuditResult)
    assert [e.detail for e in audit.entries] == ["to version 1, saved as version 3"]


async def test_an_edit_whose_audit_row_fails_is_answered_saved(console: MemoryConsole, system: MemorySystem,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import sqlite3

    from sprite_os.console import memory_api

    def no_audit(*_: object, **__: object) -> None:
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(memory_api, "record", no_audit)
    system.files.write("user.md", "# User\n", source="batch-1")
    reply = await ask(console, pm.MemoryEditRequest(request_id="e", name="user.md", text="# Mine\n",
                                                    base_sha256=sha("# User\n")))
    assert isinstance(reply, pm.MemoryEditResult) and system.files.read("user.md") == "# Mine\n"


@pytest.mark.parametrize(("name", "text", "code"), [
    ("soul.md", "# Soul\n", "not_editable"),
    ("os.md", "# OS\n", "not_editable"),
    ("notes.md", "x\n", "not_found"),
    ("../token", "x\n", "not_found"),
    ("user.md", "line\n" * 201, "over_limit"),
    ("user.md", "x" * 30_000, "over_limit"),
])
async def test_bad_edits_write_nothing(console: MemoryConsole, system: MemorySystem, name: str, text: str,
                                       code: str) -> None:
    before = sorted(p.name for p in system.settings.layout.memory_dir.rglob("*"))
    error = await failure(console, pm.MemoryEditRequest(request_id="e", name=name, text=text,
                                                        base_sha256=sha("")))
    assert error.code == code
    assert sorted(p.name for p in system.settings.layout.memory_dir.rglob("*")) == before


async def test_rollback_to_any_version_is_a_new_version(console: MemoryConsole, system: MemorySystem) -> None:
    for n in (1, 2, 3):
        system.files.write("context.md", f"# Now\n- step {n}\n", source=f"batch-{n}")
    reply = await ask(console, pm.MemoryRollbackRequest(request_id="r", name="context.md", number=1))
    assert isinstance(reply, pm.MemoryRollbackResult)
    assert system.files.read("context.md") == "# Now\n- step 1\n"
    assert (reply.version.number, reply.version.source, reply.file.versions) == (4, "rollback-to-1", 4)
    assert (await failure(console, pm.MemoryRollbackRequest(request_id="r", name="context.md", number=7))).code \
        == "not_found"
    audit = await ask(console, pm.MemoryAuditRequest(request_id="a"))
    assert isinstance(audit, pm.MemoryAuditResult)
    assert audit.entries[0].detail == "to version 1, saved as version 4"


# ---------------------------------------------------------------- learnings


async def test_search_shows_type_date_confidence_and_the_source_turn(console: MemoryConsole,
                                                                     system: MemorySystem) -> None:
    ids = await seed(system)
    reply = await ask(console, pm.MemorySearchRequest(request_id="s", query="what is Ada's name?"))
    assert isinstance(reply, pm.MemorySearchResult)
    top = reply.hits[0]
    assert (top.kind, top.type, top.content, top.confidence) == ("learning", "FACT", "The user's name is Ada Lovelace",
                                                                 0.8)
    assert top.score is not None and top.score > 0 and top.forgotten_at is None
    assert top.turn == pm.TurnRef(observation_id=ids[0], session_id="s1", sequence_num=1, timestamp=NOW - 59)
    listed = await ask(console, pm.MemorySearchRequest(request_id="s"))  # no query: the newest
    assert isinstance(listed, pm.MemorySearchResult)
    assert [h.type for h in listed.hits] == ["ACTION", "PREFERENCE", "FACT"]
    assert listed.hits[0].turn is None and listed.hits[0].score is None  # the curator cited no turn
    typed = await ask(console, pm.MemorySearchRequest(request_id="s", query="Ada", types=["PREFERENCE"]))
    assert isinstance(typed, pm.MemorySearchResult) and [h.type for h in typed.hits] == ["PREFERENCE"]


async def test_past_turns_follow_the_learnings_and_never_crowd_them_out(
        console: MemoryConsole, system: MemorySystem, monkeypatch: pytest.MonkeyPatch) -> None:
    ids = await seed(system)
    episodes = [RecallHit("episode", 100 + n, 1.0 - n / 100, NOW, "s1", n + 1, 100 + n, "EPISODE", f"turn {n} about Ada")
                for n in range(30)]  # raw turns match many words: they rank first
    learning = RecallHit("learning", 1, 0.1, NOW, "s1", 1, ids[0], "FACT", "The user's name is Ada Lovelace")

    async def found(query: str, limit: int) -> list[RecallHit]:
        return [*episodes, learning][:limit]

    monkeypatch.setattr(system, "search", found)
    reply = await ask(console, pm.MemorySearchRequest(request_id="s", query="Ada", limit=20))
    assert isinstance(reply, pm.MemorySearchResult)
    assert [h.kind for h in reply.hits] == ["learning"] + ["episode"] * 5
    only_turns = await ask(console, pm.MemorySearchRequest(request_id="s", query="Ada", types=["EPISODE"], limit=20))
    assert isinstance(only_turns, pm.MemorySearchResult) and len(only_turns.hits) == 20


async def test_a_learnings_turn_opens_from_the_transcript(console: MemoryConsole, system: MemorySystem) -> None:
    ids = await seed(system)
    reply = await ask(console, pm.MemoryTurnRequest(request_id="t", observation_id=ids[1]))
    assert isinstance(reply, pm.MemoryTurnResult)
    turn = reply.turn
    assert (turn.session_id, turn.sequence_num, turn.user_message, turn.agent_response, turn.processed) == (
        "s1", 2, "message 2", "answer 2", "pending")
    assert turn.tool_calls == [pm.ToolCall(name="Bash", input='{"command": "ls"}', output="a.txt", is_error=False)]
    assert (await failure(console, pm.MemoryTurnRequest(request_id="t", observation_id=999))).code == "not_found"


async def test_a_turn_whose_tool_calls_are_no_list_opens_without_them(console: MemoryConsole, system: MemorySystem) -> None:
    """An older import or a hand-made row may hold any JSON in tool_calls_json: a number, text, an object."""
    def turns(t: TranscriptDB) -> list[int]:
        return [t.append(NewObservation(timestamp=NOW, session_id="s9", sequence_num=n, user_message="hi",
                                        agent_response="hello", tool_calls_json=bad)) or 0
                for n, bad in enumerate(["5", '"text"', '{"name": "Bash"}', "not json"], 1)]

    for observation_id in await system.transcript.call(turns):
        reply = await ask(console, pm.MemoryTurnRequest(request_id="t", observation_id=observation_id))
        assert isinstance(reply, pm.MemoryTurnResult) and reply.turn.tool_calls == []


async def search_ids(console: MemoryConsole, query: str, **kwargs: object) -> list[int]:
    reply = await console.handle(pm.MemorySearchRequest(request_id="s", query=query, **kwargs))  # type: ignore[arg-type]
    assert isinstance(reply, pm.MemorySearchResult)
    return [h.id for h in reply.hits]


async def test_forget_leaves_search_and_the_boot_prompt_is_audited_and_undone(
        console: MemoryConsole, system: MemorySystem, capsys: pytest.CaptureFixture[str]) -> None:
    await seed(system)
    [tea] = [i for i in await search_ids(console, "tea morning") if i == 2]
    transcript_before = await system.transcript.call(lambda t: list(t.iter_all()))
    forgot = await ask(console, pm.MemoryForgetRequest(request_id="f", learning_id=tea))
    assert isinstance(forgot, pm.MemoryForgetResult) and forgot.learning.forgotten_at == NOW
    assert tea not in await search_ids(console, "tea morning")
    assert tea not in await search_ids(console, "")
    assert await search_ids(console, "", forgotten=True) == [tea]
    assert [h.id for h in await system.search("tea in the morning", 10)] == [3]  # the agent's search_memory: the same search
    prompt = await system.loader.boot_prompt()
    assert "Ada likes tea" not in prompt and "The user's name is Ada Lovelace" in prompt
    assert await system.transcript.call(lambda t: list(t.iter_all())) == transcript_before  # untouched
    assert cli(["--workspace", str(system.settings.workspace), "memory", "search", "tea morning"]) == 0
    assert "likes tea" not in capsys.readouterr().out
    again = await ask(console, pm.MemoryForgetRequest(request_id="f", learning_id=tea))  # already: no new entry
    assert isinstance(again, pm.MemoryForgetResult) and again.learning.forgotten_at == NOW
    back = await ask(console, pm.MemoryUnforgetRequest(request_id="u", learning_id=tea))
    assert isinstance(back, pm.MemoryUnforgetResult) and back.learning.forgotten_at is None
    assert tea in await search_ids(console, "tea morning")
    assert "Ada likes tea" in await system.loader.boot_prompt()
    audit = await ask(console, pm.MemoryAuditRequest(request_id="a"))
    assert isinstance(audit, pm.MemoryAuditResult)
    assert [(e.action, e.learning_id, e.at) for e in audit.entries] == [("unforget", tea, NOW), ("forget", tea, NOW)]
    assert audit.entries[1].detail == "PREFERENCE: Ada likes tea in the morning"
    for request in (pm.MemoryForgetRequest(request_id="f", learning_id=99),
                    pm.MemoryUnforgetRequest(request_id="u", learning_id=99)):
        assert (await failure(console, request)).code == "not_found"


async def test_a_forgotten_action_leaves_the_pending_actions(console: MemoryConsole, system: MemorySystem) -> None:
    await seed(system)
    assert "Remind Ada about the tea order" in await system.loader.boot_prompt()
    await ask(console, pm.MemoryForgetRequest(request_id="f", learning_id=3))
    assert await system.memory.call(lambda m: m.pending_actions()) == []
    assert "Remind Ada" not in await system.loader.boot_prompt()


async def test_forgetting_survives_a_rebuild_and_the_same_text_learned_again(system: MemorySystem,
                                                                           console: MemoryConsole) -> None:
    await seed(system)
    await ask(console, pm.MemoryForgetRequest(request_id="f", learning_id=2))
    layout = system.settings.layout
    with contextlib.closing(read_only(layout.memory_db)) as conn:
        keys = forgotten_keys(conn)
    assert len(keys) == 1 and list(keys.values()) == [NOW]
    fresh = MemoryDB(layout.memory_db.with_name("rebuilt.db"))  # what a rebuild makes from the transcript
    fresh.commit_batch(trigger="rebuild", observation_ids=[1, 2], model="m", input_tokens=0, output_tokens=0,
                       cost_usd=0, learnings=[NewLearning("PREFERENCE", "Ada likes tea in the morning.")],
                       file_updates={}, base_hashes={})
    assert forget_again(fresh, keys) == 1
    assert fresh.learnings_since(0) == []
    assert read_before(layout.memory_db.with_name("missing.db"), None) == ([], {}, [])


# ---------------------------------------------------------------- the daemon and the boot prompt


async def test_health_counts_today_apart_from_all_time(console: MemoryConsole, system: MemorySystem) -> None:
    await seed(system)
    yesterday = day_start(NOW) - 3600

    def old_failure(m: MemoryDB) -> None:
        m.record_failed_batch(trigger="t", observation_ids=[1], model="m", error="proxy down", input_tokens=50,
                              cost_usd=0.5)
        m.conn.execute("UPDATE batches SET created_at = ? WHERE status = 'failed'", (yesterday,))
        m.conn.execute("UPDATE batches SET created_at = ? WHERE status != 'failed'", (NOW - 60,))  # this morning

    await system.memory.call(old_failure)
    reply = await ask(console, pm.MemoryHealthRequest(request_id="h"))
    assert isinstance(reply, pm.MemoryHealthResult)
    h = reply.health
    assert (h.total.batches, h.total.failed_batches, h.total.input_tokens, h.total.cost_usd) == (2, 1, 150, 0.5002)
    assert (h.today.batches, h.today.failed_batches, h.today.input_tokens) == (1, 0, 100)
    assert h.observations == {"pending": 2, "processed": 0, "stale": 0, "total": 2}
    assert (h.learnings, h.forgotten, h.pending_actions, h.failing, h.running) == (3, 0, 1, False, False)
    assert h.last_batch is not None and (h.last_batch.status, h.last_batch.error) == ("failed", "proxy down")
    await system.recall.start()  # how far search has caught up, as the health view shows it
    try:
        await asyncio.wait_for(system.recall.indexer.current.wait(), 20)
        await asyncio.wait_for(system.recall.indexer.embedded_all.wait(), 60)
        again = await ask(console, pm.MemoryHealthRequest(request_id="h2"))
    finally:
        await system.recall.stop()
    assert isinstance(again, pm.MemoryHealthResult) and again.health.recall is not None
    r = again.health.recall
    assert (r.turns, r.waiting_for_index, r.embedded, r.waiting_for_vectors, r.importing) == (2, 0, 2, 0, None)


async def test_health_answers_and_says_so_while_imports_fail_between_attempts(console: MemoryConsole,
                                                                             system: MemorySystem) -> None:
    """Between two failed attempts no file is under way: Health failed on the missing figures (the person
    read "the server failed to answer"); it answers, and says why imports wait."""
    system.imports.failing, system.imports.failure = 2, "OSError(28, 'No space left on device')"
    reply = await ask(console, pm.MemoryHealthRequest(request_id="h"))
    assert isinstance(reply, pm.MemoryHealthResult) and reply.health.recall is not None
    r = reply.health.recall
    assert (r.importing, r.imported, r.import_failing) == (None, 0, "OSError(28, 'No space left on device')")
    assert r.import_set_aside == []


async def test_health_says_an_import_the_server_gave_up_on_apart_from_one_it_retries(
        console: MemoryConsole, system: MemorySystem) -> None:
    """A set-aside file's message came as `import_failing`, and the page said "Import waiting" of a file
    never retried again: it has a field of its own, and is not said to be failing."""
    aside = import_inbox.inbox_dir(system.settings.layout) / f"past{import_inbox.SUFFIX}{import_inbox.SET_ASIDE_SUFFIX}"
    aside.parent.mkdir(parents=True, exist_ok=True)
    aside.write_text("")
    reply = await ask(console, pm.MemoryHealthRequest(request_id="h"))
    assert isinstance(reply, pm.MemoryHealthResult) and reply.health.recall is not None
    assert (reply.health.recall.import_failing, reply.health.recall.import_set_aside) == (None, [aside.name])


def test_health_types_and_words_every_reason_the_pass_keeps_a_forget_for() -> None:
    """Health's `kept_why` was typed `str`, its comment listing three reasons after the pass had a fourth
    (`error`): the frame names each of the pass's KEPT_* reasons, and the page has words for each."""
    import re
    import typing

    from sprite_os.memory.forget import turns

    reasons = {turns.KEPT_DISK, turns.KEPT_INDEX, turns.KEPT_CHECK, turns.KEPT_READER, turns.KEPT_ERROR}
    hint = typing.get_type_hints(pm.ForgetProgress, include_extras=True)["kept_why"]
    assert {arg for lit in typing.get_args(hint) for arg in typing.get_args(lit)} == reasons
    page = (Path(pm.__file__).parent / "static/js/memory_status.js").read_text()
    kept_because = page.split("const KEPT_BECAUSE = {", 1)[1].split("};", 1)[0]
    assert set(re.findall(r"^\s*(\w+):", kept_because, re.MULTILINE)) == reasons


async def test_health_counts_the_forgets_not_finished_as_healthz_does(console: MemoryConsole,
                                                                        system: MemorySystem) -> None:
    """A forget whose lines the daemon's pass has yet to take out of the memory files is counted; Health said
    nothing of forgets at all."""
    from sprite_os.memory.forget.jobs import add_job

    reply = await ask(console, pm.MemoryHealthRequest(request_id="h"))
    assert isinstance(reply, pm.MemoryHealthResult)
    assert reply.health.forgets == pm.ForgetProgress(waiting=0)
    await system.memory.call(lambda m: add_job(m, [1], ["s1"], {"a" * 64}, NOW))
    again = await ask(console, pm.MemoryHealthRequest(request_id="h2"))
    assert isinstance(again, pm.MemoryHealthResult) and again.health.forgets is not None
    forgets = again.health.forgets
    assert (forgets.waiting, forgets.cut_short, forgets.stuck) == (1, 0, False)
    forget = (await system.health())["forget"]  # what /healthz says of the same state
    assert (forgets.waiting, forgets.cut_short, forgets.kept_for_s, forgets.kept_why, forgets.stuck) == (
        forget["jobs_waiting"], forget["cut_short_jobs"], forget["kept_for_s"], forget["kept_why"], forget["degraded"])


async def forget_cut_short(system: MemorySystem, monkeypatch: pytest.MonkeyPatch, *, session: bool = False) -> list[int]:
    """seed()'s turns, in session s1 started at NOW - 120, the first's forget (or, with `session`, the whole
    session's) cut short by a disk error before its tombstone. Returns the turns."""
    await system.transcript.call(lambda t: t.start_session("s1", NOW - 120))
    ids = await seed(system)

    def failing(*_: object) -> None:
        raise OSError(5, "Input/output error")

    with monkeypatch.context() as patched:
        patched.setattr(TranscriptDB, "forget", failing)
        with pytest.raises(OSError):
            await (system.forget_turns(session_id="s1", by="test") if session else system.forget_turns([ids[0]], by="test"))
    return ids


async def test_health_names_the_session_of_a_forget_an_error_cut_short(console: MemoryConsole, system: MemorySystem,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A forget an error cut short keeps its turn's words until the person forgets it again, which they can do
    only if they can find it: Health said how many, not where, so a person back days later could not act."""
    ids = await forget_cut_short(system, monkeypatch)
    await system.forgetting.rewrite_files()  # the pass counts it
    reply = await ask(console, pm.MemoryHealthRequest(request_id="h"))
    assert isinstance(reply, pm.MemoryHealthResult) and reply.health.forgets is not None
    forgets = reply.health.forgets
    assert (forgets.cut_short, forgets.stuck, forgets.cut_short_in, forgets.cut_short_sessions) == (1, True, [NOW - 120], 0)
    assert "message" not in msgspec.json.encode(forgets).decode()  # when, never a word of it
    await system.forget_turns([ids[0]], by="test")
    await system.forgetting.decided(30)
    await system.forgetting.rewrite_files()
    again = await ask(console, pm.MemoryHealthRequest(request_id="h2"))
    assert isinstance(again, pm.MemoryHealthResult) and again.health.forgets == pm.ForgetProgress(waiting=0)


async def test_health_says_a_forget_cut_short_of_a_whole_session_was_of_the_session(
        console: MemoryConsole, system: MemorySystem, monkeypatch: pytest.MonkeyPatch) -> None:
    """A forget of a whole session cut short: Health told the person to forget "the turn" again, where they had
    forgotten the session (Past sessions' Forget session). It counts those apart, at once and after the pass's
    count alike; forgotten again, none is left."""
    await forget_cut_short(system, monkeypatch, session=True)
    for counted in (False, True):
        if counted:
            await system.forgetting.rewrite_files()
        reply = await ask(console, pm.MemoryHealthRequest(request_id="h"))
        assert isinstance(reply, pm.MemoryHealthResult) and reply.health.forgets is not None
        assert (reply.health.forgets.cut_short, reply.health.forgets.cut_short_sessions) == (1, 1)
    await system.forget_turns(session_id="s1", by="test")
    again = await ask(console, pm.MemoryHealthRequest(request_id="h2"))
    assert isinstance(again, pm.MemoryHealthResult) and again.health.forgets is not None
    assert (again.health.forgets.cut_short, again.health.forgets.cut_short_sessions) == (0, 0)


async def test_health_says_a_forget_cut_short_before_the_daemon_is_free_to_count_it(
        console: MemoryConsole, system: MemorySystem, monkeypatch: pytest.MonkeyPatch) -> None:
    """A forget an error cut short was counted by the daemon's pass alone, which waits for a batch under way (a
    backlog's batches, a slow curator): meanwhile Health said its lines were being taken out of the memory
    files, and /healthz ok, while the turn kept every word. Here no daemon runs: the pass never comes."""
    await forget_cut_short(system, monkeypatch)
    reply = await ask(console, pm.MemoryHealthRequest(request_id="h"))
    assert isinstance(reply, pm.MemoryHealthResult) and reply.health.forgets is not None
    forgets = reply.health.forgets
    assert (forgets.waiting, forgets.cut_short, forgets.stuck, forgets.cut_short_in) == (1, 1, True, [NOW - 120])
    assert (await system.status())["degraded"] is True


async def test_health_no_longer_says_a_forget_is_cut_short_once_it_is_forgotten_again(
        console: MemoryConsole, system: MemorySystem, monkeypatch: pytest.MonkeyPatch) -> None:
    """Forgotten again, the turn has lost its words: Health went on saying "forget the turn again" (and /healthz
    degraded) until the daemon's pass, which waits for a batch under way. Here no daemon runs."""
    ids = await forget_cut_short(system, monkeypatch)
    await system.forgetting.rewrite_files()  # the pass has counted it
    await system.forget_turns([ids[0]], by="test")
    reply = await ask(console, pm.MemoryHealthRequest(request_id="h"))
    assert isinstance(reply, pm.MemoryHealthResult) and reply.health.forgets is not None
    forgets = reply.health.forgets
    assert (forgets.waiting, forgets.cut_short, forgets.stuck, forgets.cut_short_in) == (2, 0, False, [])
    assert (await system.status())["degraded"] is False


async def test_health_names_the_backups_the_forget_pass_could_not_read_until_they_are_gone(
        console: MemoryConsole, system: MemorySystem, monkeypatch: pytest.MonkeyPatch) -> None:
    """A backup the forget's pass could not read may keep a forgotten turn's words: /healthz and memory status
    named it for the operator, and the console's Health said nothing (memory degraded, no word why). It names
    each one, as /healthz does, from the pass's own state; not `stuck` (no forget waits), and no longer once the
    file is gone, in the very answer after its removal (its listing looks before the forgets are read)."""
    from sprite_os.memory import system as system_module

    monkeypatch.setattr(system_module, "HEALTH_WAIT", 60)  # each answer's listing finished before it is read
    ids = await seed(system)
    damaged = system.settings.layout.memory_dir / "memory.db.before-rebuild-20250101T000000"
    damaged.write_bytes(b"SQLite format 3\x00" + b"message 1 answer 1 " * 400)
    await system.forget_turns([ids[0]], by="test")
    assert await system.forgetting.decided(30)
    await system.forgetting.rewrite_files()  # the pass, which passes the damaged copy over
    reply = await ask(console, pm.MemoryHealthRequest(request_id="h"))
    assert isinstance(reply, pm.MemoryHealthResult) and reply.health.forgets is not None
    forgets = reply.health.forgets
    healthz = (await system.status())["forget"]
    assert forgets.unreadable_backups == healthz["unreadable_backups"] == ["memory/" + damaged.name]
    assert (forgets.waiting, forgets.stuck, healthz["degraded"]) == (0, False, True)
    damaged.unlink()  # the operator removed it
    again = await ask(console, pm.MemoryHealthRequest(request_id="h2"))
    assert isinstance(again, pm.MemoryHealthResult) and again.health.forgets == pm.ForgetProgress(waiting=0)


async def test_health_names_a_backup_whose_name_is_no_utf_8(
        console: MemoryConsole, system: MemorySystem, monkeypatch: pytest.MonkeyPatch) -> None:
    """A backup named with a byte that is no UTF-8 (a copy made on a host of another encoding) reads in Python
    with a lone surrogate, which the frame's encoder refuses: the Health the backup should show failed whole. Its
    name is shown with that byte escaped (\\xff), the rest as it is."""
    from sprite_os import protocol
    from sprite_os.memory import system as system_module

    monkeypatch.setattr(system_module, "HEALTH_WAIT", 60)
    ids = await seed(system)
    folder = os.fsencode(system.settings.layout.memory_dir)
    damaged = os.fsdecode(folder + b"/memory.db.before-rebuild-\xff<img src=x onerror=alert(1)>")
    Path(damaged).write_bytes(b"SQLite format 3\x00" + b"message 1 answer 1 " * 400)
    await system.forget_turns([ids[0]], by="test")
    assert await system.forgetting.decided(30)
    await system.forgetting.rewrite_files()
    reply = await ask(console, pm.MemoryHealthRequest(request_id="h"))
    assert isinstance(reply, pm.MemoryHealthResult) and reply.health.forgets is not None
    sent = msgspec.json.decode(protocol.encode(reply))
    assert sent["health"]["forgets"]["unreadable_backups"] == ["memory/memory.db.before-rebuild-\\xff<img src=x onerror=alert(1)>"]
    Path(damaged).unlink()
    again = await ask(console, pm.MemoryHealthRequest(request_id="h2"))
    assert isinstance(again, pm.MemoryHealthResult) and again.health.forgets == pm.ForgetProgress(waiting=0)


async def test_health_shows_the_agents_spending_beside_the_curators(system: MemorySystem) -> None:
    spend = {"daily_usd": 10.0, "spent_today_usd": 1.25, "in_flight_usd": 0.5, "calls_today": 7,
             "refused_today": {"budget": 1}, "resets_at": day_start(NOW) + 86_400, "models": ["m"],
             "max_tokens": 32_000, "requests_per_minute": 60}
    reply = await ask(MemoryConsole(system, clock=lambda: NOW, agent_spend=lambda: spend),
                      pm.MemoryHealthRequest(request_id="h"))
    assert isinstance(reply, pm.MemoryHealthResult) and reply.health.agent is not None
    agent = reply.health.agent
    assert (agent.daily_usd, agent.spent_today_usd, agent.calls_today, agent.refused_today) == (10.0, 1.25, 7, {"budget": 1})
    alone = await ask(MemoryConsole(system, clock=lambda: NOW), pm.MemoryHealthRequest(request_id="h2"))
    assert isinstance(alone, pm.MemoryHealthResult) and alone.health.agent is None


async def test_the_boot_prompt_is_exactly_the_next_sessions(console: MemoryConsole, system: MemorySystem) -> None:
    await seed(system)
    system.files.write("soul.md", "# Soul\nYou are Sprite.\n", source="deploy")
    reply = await ask(console, pm.MemoryBootPromptRequest(request_id="b"))
    assert isinstance(reply, pm.MemoryBootPromptResult)
    assert reply.text == await system.loader.boot_prompt()
    assert reply.text.startswith("# Soul\nYou are Sprite.") and "The user's name is Ada Lovelace" in reply.text
    assert reply.chars == len(reply.text) and reply.tokens_estimate == -(-len(reply.text) // 4)
    assert "characters / 4" in reply.estimate


@pytest.mark.parametrize(("source", "said"), [
    ("person-edit", "another tab or device"), ("rollback-to-3", "another tab or device"),
    ("batch-7", "the memory daemon rewrote it"), ("rebuild-batch-2", "the memory daemon rewrote it"),
    ("forget", "a forget took text out of it"), ("deploy", "a deploy replaced it"), ("on-disk", "edited on disk"),
])
def test_an_overtaken_edit_names_who_changed_the_file(source: str, said: str) -> None:
    from sprite_os.console.memory_files import changed_by
    from sprite_os.memory.files import Version

    assert said in changed_by(Version(3, NOW, source, Path("x")))


async def test_the_console_reads_memory_db_and_changes_it_only_through_the_daemon(
        system: MemorySystem, console: MemoryConsole, monkeypatch: pytest.MonkeyPatch) -> None:
    """memory.db has one writer, the daemon's thread: the console's own handle on it is read-only
    (a write through it fails), and a person's forget is handed to the daemon."""
    import sqlite3

    ids = await seed(system)
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        await system.memory_reads.call(lambda m: m.conn.execute("DELETE FROM learnings"))
    assert len(await system.memory.call(lambda m: m.all_learnings())) == 3  # nothing was deleted
    handed: list[str] = []
    apply = system.daemon.apply

    async def recorded(change):  # type: ignore[no-untyped-def]
        handed.append(change.__name__)
        return await apply(change)

    monkeypatch.setattr(system.daemon, "apply", recorded)
    learning = (await system.memory.call(lambda m: m.all_learnings()))[0].id
    reply = await console.handle(pm.MemoryForgetRequest(request_id="r1", learning_id=learning))
    assert isinstance(reply, pm.MemoryForgetResult) and reply.learning.forgotten_at == NOW
    assert len(handed) == 1  # the forget (with its audit record, in the same change)
    assert ids


async def test_what_the_curator_said_that_was_left_out_is_counted_where_its_other_totals_are(
        console: MemoryConsole, system: MemorySystem, capsys: pytest.CaptureFixture[str]) -> None:
    """Learnings past the bound of a call, lines that fit no rule and file rewrites not applied were only
    logged: Health's totals (the console), /healthz's memory totals, /metrics and `memory status` count them,
    and the status's text says them in words only when there are any."""
    import json

    from sprite_os.memory.memory_store import LeftOut
    from sprite_os.metrics import Metrics
    from tests.test_metrics import body, samples

    workspace = ["--workspace", str(system.settings.layout.root), "memory", "status"]
    assert await asyncio.to_thread(cli, workspace) == 0
    assert "left out" not in capsys.readouterr().out  # none yet: not a word
    for left_out in (LeftOut(learnings_over_bound=12, lines_ignored=2), LeftOut(lines_ignored=1, files_rejected=1)):
        await system.memory.call(lambda m, left_out=left_out: m.commit_batch(
            trigger="batch", observation_ids=[1], model="claude-haiku-4-5", input_tokens=100, output_tokens=20,
            cost_usd=0.0002, learnings=[], file_updates={}, base_hashes={}, left_out=left_out))
    counts = {"learnings_over_bound": 12, "lines_ignored": 3, "files_rejected": 1}
    reply = await ask(console, pm.MemoryHealthRequest(request_id="h"))
    assert isinstance(reply, pm.MemoryHealthResult)
    assert {k: v for k, v in msgspec.structs.asdict(reply.health.total).items() if k in counts} == counts
    health = await system.health()  # /healthz's memory block
    assert {k: v for k, v in health["totals"].items() if k in counts} == counts
    scraped = samples(Metrics().render({**body(), "memory": health}))
    assert {name: scraped[(f"sprite_curator_{name}_total", ())] for name in counts} == counts
    assert await asyncio.to_thread(cli, [*workspace, "--json"]) == 0
    assert {k: v for k, v in json.loads(capsys.readouterr().out)["totals"].items() if k in counts} == counts
    assert await asyncio.to_thread(cli, workspace) == 0
    # A line each, under one label, as the status's other lines: it was one line of 280 characters, which said
    # "left out  12 learnings ... were left out".
    assert ("  left out         12 learnings past what one curator call may keep, dropped (their turns are marked "
            "curated all the same)\n"
            "                   3 lines of curator replies that followed no rule of the format, ignored\n"
            "                   1 memory file rewrite curator replies gave, not applied (given twice, empty, cut off, "
            "over its limit, or of a file the curator may not write)\n") in capsys.readouterr().out
