"""A forget is never acknowledged while turns it names still wait in capture's queue (transcript.db
locked or failing): they would land after it, words and all, and be curated."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from devkit.harness import make_settings, wait_for
from sprite_os.errors import ForgetWouldMiss, SpriteOSError
from sprite_os.memory import system as system_mod
from sprite_os.memory.capture.journal import Entry
from sprite_os.memory.capture.spill import ObservationWrite
from sprite_os.memory.system import MemorySystem
from sprite_os.memory.transcript_store import NewObservation, TranscriptDB

T0 = 1_800_000_000.0


def turn(n: int, user: str, session: str = "s1") -> NewObservation:
    return NewObservation(timestamp=T0 + n, session_id=session, sequence_num=n, user_message=user,
                          tool_calls_json="[]", agent_response="noted", turn_id=f"{session}-t{n}", status="completed")


class Held:
    """transcript.db's appends fail (locked by another process) while `on`; the forget's own writes go through."""

    on = False


@pytest.fixture
async def system(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[MemorySystem]:
    monkeypatch.setattr(system_mod, "FORGET_DRAIN_BUDGET", 0.3)
    real = TranscriptDB.append

    def append(self: TranscriptDB, obs: NewObservation) -> int | None:
        if Held.on:
            raise sqlite3.OperationalError("database is locked")
        return real(self, obs)

    monkeypatch.setattr(TranscriptDB, "append", append)
    Held.on = False
    settings = make_settings(tmp_path / "ws", "http://127.0.0.1:9", embedding_model="off")
    settings.layout.ensure()
    memory = MemorySystem(settings)
    await memory.start()
    await memory.transcript.call(lambda t: (t.start_session("s1", T0), t.append(turn(1, "My name is Ada"))))
    yield memory
    Held.on = False
    await memory.stop()


async def words(system: MemorySystem) -> list[str]:
    rows = await system.transcript.call(lambda t: list(t.iter_all()))
    return [o.user_message for o in rows]


@pytest.mark.parametrize("named", ["session", "wire id"])
async def test_a_forget_while_a_named_turn_waits_to_be_saved_is_refused_not_acknowledged(
        system: MemorySystem, named: str) -> None:
    Held.on = True
    system.writer.submit(ObservationWrite(turn(2, "I live in Lisbon")))
    await wait_for(lambda: system.writer.failing, what="the write failing")
    refused: SpriteOSError | None = None
    try:
        if named == "session":
            await system.forget_turns(session_id="s1", by="test")
        else:
            await system.forget_turns(turn_ids=["s1-t1", "s1-t2"], by="test")
    except SpriteOSError as exc:
        refused = exc
    Held.on = False
    assert await system.writer.drained(30)
    # Acknowledged, the forget would have let turn 2 land after it, its words kept.
    assert refused is not None and "still being saved" in str(refused)
    assert "I live in Lisbon" in await words(system)  # nothing was forgotten: the person tries again
    again = await system.forget_turns(session_id="s1", by="test") if named == "session" else \
        await system.forget_turns(turn_ids=["s1-t1", "s1-t2"], by="test")
    assert sorted(o.sequence_num for o in again.turns) == [1, 2]
    assert not {"My name is Ada", "I live in Lisbon"} & set(await words(system))


async def test_another_sessions_turns_waiting_do_not_hold_up_a_forget(system: MemorySystem) -> None:
    Held.on = True
    system.writer.submit(ObservationWrite(turn(1, "I live in Lisbon", session="s2")))
    await wait_for(lambda: system.writer.failing, what="the write failing")
    done = await system.forget_turns(session_id="s1", by="test")
    assert [o.sequence_num for o in done.turns] == [1]
    Held.on = False
    assert await system.writer.drained(30)


async def test_a_forget_by_session_or_wire_id_waits_for_a_set_aside_turn_journal_to_be_replayed(tmp_path: Path) -> None:
    """A turn journal a start could not read is kept for the operator's replay (rename it back). It may hold
    turns transcript.db never got: a forget of their session left them there, with no tombstone, and the
    replay then recorded them, words and all, to be curated, indexed and embedded. Such a forget is refused
    until the journal is replayed or removed; one by row id is not held up (a replay never records it again)."""
    settings = make_settings(tmp_path / "ws", "http://127.0.0.1:9", embedding_model="off")
    settings.layout.ensure()
    aside = settings.layout.state_dir / "turn-journal.json.unreadable-20261127T091500"  # as a start sets one aside
    aside.write_bytes(msgspec.json.encode([Entry(turn(2, "I live in Lisbon"), ended=True)]) + b"\n")
    memory = MemorySystem(settings)
    await memory.start()
    try:
        await memory.transcript.call(lambda t: (t.start_session("s1", T0), t.append(turn(1, "My name is Ada"))))
        for named in ({"session_id": "s1"}, {"turn_ids": ["s1-t2"]}):
            with pytest.raises(ForgetWouldMiss, match="turn journal the server could not read") as refused:
                await memory.forget_turns(by="test", **named)  # type: ignore[arg-type]
            assert "needs the operator" in str(refused.value) and "try again" not in str(refused.value)
        assert await words(memory) == ["My name is Ada"]  # nothing forgotten: the person tries again later
        (row,) = await memory.transcript.call(lambda t: t.ids_of(session_id="s1"))
        assert [o.sequence_num for o in (await memory.forget_turns([row], by="test")).turns] == [1]
    finally:
        await memory.stop()
    aside.rename(settings.layout.state_dir / "turn-journal.json")  # the operator replays it, as the docs say
    memory = MemorySystem(settings)
    await memory.start()
    try:
        assert await wait_for_words(memory, "I live in Lisbon")
        done = await memory.forget_turns(session_id="s1", by="test")
        assert [o.sequence_num for o in done.turns] == [2]
        assert not {"My name is Ada", "I live in Lisbon"} & set(await words(memory))
    finally:
        await memory.stop()


async def test_a_forget_by_session_or_wire_id_is_refused_while_the_turn_journal_is_stuck(system: MemorySystem) -> None:
    """A journal a start could neither read nor set aside stays where it is, and the next start reads it
    again: if the read then succeeds, its turns are replayed with no one asking, a forgotten session's too,
    with no tombstone. So a forget by session or wire id is refused while it is stuck; one by row id is not."""
    system.capture.journal.restore([], stuck=True)
    for named in ({"session_id": "s1"}, {"turn_ids": ["s1-t1"]}):
        with pytest.raises(ForgetWouldMiss, match="could neither read nor set aside") as refused:
            await system.forget_turns(by="test", **named)  # type: ignore[arg-type]
        assert "needs the operator" in str(refused.value) and "try again" not in str(refused.value)
    assert await words(system) == ["My name is Ada"]
    (row,) = await system.transcript.call(lambda t: t.ids_of(session_id="s1"))
    assert [o.sequence_num for o in (await system.forget_turns([row], by="test")).turns] == [1]


async def wait_for_words(system: MemorySystem, text: str) -> bool:
    await system.writer.drained(30)
    return text in await words(system)


@pytest.mark.parametrize("waiting", ["being written", "queued", "set aside"])
async def test_a_forget_by_session_is_refused_while_an_import_still_holds_turns_of_that_session(
        system: MemorySystem, waiting: str) -> None:
    """An import file in the inbox (queued, being applied, or set aside for the operator's retry) holds turns
    of the session named that are not recorded yet: they would land after the forget, words and all. The
    forget is refused, and once the file is applied the session is forgotten whole. Another session's
    import holds nothing up. "being written": a `memory import` still writing its file (a large one takes a
    while), which the forget missed: the file came into the inbox after the forget, words and all."""
    from sprite_os.memory import import_inbox
    from sprite_os.memory.transcript_store import ImportedTurn

    layout = system.settings.layout
    await system.imports.stop()  # the file waits, as one does behind a slow or failing import
    path, _ = import_inbox.write(layout, [ImportedTurn("s1", T0 + 50, "I live in Lisbon", "[]", "noted"),
                                          ImportedTurn("s2", T0 + 60, "I like tea", "[]", "noted")])
    final = path
    if waiting != "queued":  # as `memory import` (this process) writes it, or set aside
        path = path.rename(path.with_name(import_inbox.partial_name(path.name.removesuffix(import_inbox.SUFFIX))
                                          if waiting == "being written" else path.name + import_inbox.SET_ASIDE_SUFFIX))
    with pytest.raises(SpriteOSError, match="import"):
        await system.forget_turns(session_id="s1", by="test")
    assert await words(system) == ["My name is Ada"]  # nothing was forgotten
    await system.forget_turns(session_id="s3", by="test")  # no turn of s3 waits
    path.rename(final)
    system.imports.start()
    await wait_for(lambda: not import_inbox.inbox_files(layout), timeout=30, what="the import applied")
    done = await system.forget_turns(session_id="s1", by="test")
    assert len(done.turns) == 2 and await words(system) == ["", "", "I like tea"]


async def test_a_forget_of_a_recorded_turn_an_import_file_still_holds_is_refused_until_the_file_is_gone(
        system: MemorySystem) -> None:
    """An import file set aside after its first turns were recorded (or one still being applied) keeps those turns'
    words on disk: a forget of such a turn by its id went ahead, said done, and the file kept its words until the
    operator renamed it back and it was applied (or for good). The forget is refused, saying why, until the file is
    gone; a turn no file holds is forgotten as before."""
    from sprite_os.memory import import_inbox
    from sprite_os.memory.transcript_store import ImportedTurn

    layout = system.settings.layout
    await system.imports.stop()
    lisbon = ImportedTurn("s2", T0 + 50, "I live in Lisbon", "[]", "noted")
    await system.transcript.call(lambda t: t.import_turns([lisbon]))  # recorded: the file's first part applied
    path, _ = import_inbox.write(layout, [lisbon, ImportedTurn("s2", T0 + 60, "I like tea", "[]", "noted")])
    path = path.rename(path.with_name(path.name + import_inbox.SET_ASIDE_SUFFIX))  # the server gave up on the rest
    (row,) = await system.transcript.call(lambda t: t.ids_of(session_id="s2"))
    with pytest.raises(SpriteOSError, match="import"):
        await system.forget_turns([row], by="test")
    assert "I live in Lisbon" in await words(system)  # nothing was forgotten
    (ada,) = await system.transcript.call(lambda t: t.ids_of(session_id="s1"))
    await system.forget_turns([ada], by="test")  # a turn no file holds
    path.unlink()  # the operator removes the file (or renames it back and it is applied)
    assert len((await system.forget_turns([row], by="test")).turns) == 1
    assert await words(system) == ["", ""]


async def test_an_import_file_that_cant_be_read_refuses_only_the_forget_of_turns_an_import_could_have_recorded(
        system: MemorySystem) -> None:
    """An inbox file the server can't read may hold any imported turn, so the forget of a recorded turn was refused
    while it stayed: a person's forget of a turn captured live too, by row or wire id, though no import records a
    turn with a wire id. Only the forget of a turn with none (an import's, or one recorded before wire ids) is."""
    from sprite_os.memory import import_inbox
    from sprite_os.memory.transcript_store import ImportedTurn

    layout = system.settings.layout
    await system.imports.stop()
    lisbon = ImportedTurn("s2", T0 + 50, "I live in Lisbon", "[]", "noted")
    await system.transcript.call(lambda t: (t.import_turns([lisbon]), t.append(turn(2, "I like tea"))))
    path, _ = import_inbox.write(layout, [lisbon])
    path.unlink()
    (unreadable := path.with_name(path.name + import_inbox.SET_ASIDE_SUFFIX)).mkdir()  # open() fails, root or not
    (imported,) = await system.transcript.call(lambda t: t.ids_of(session_id="s2"))
    with pytest.raises(SpriteOSError, match="import"):
        await system.forget_turns([imported], by="test")
    (ada, _) = await system.transcript.call(lambda t: t.ids_of(session_id="s1"))
    with pytest.raises(SpriteOSError, match="import"):  # with a turn an import could have recorded: refused whole
        await system.forget_turns([ada, imported], by="test")
    assert [o.sequence_num for o in (await system.forget_turns([ada], by="test")).turns] == [1]
    assert [o.sequence_num for o in (await system.forget_turns(turn_ids=["s1-t2"], by="test")).turns] == [2]
    assert await words(system) == ["", "I live in Lisbon", ""]
    unreadable.rmdir()
    assert len((await system.forget_turns([imported], by="test")).turns) == 1
