"""A person's edit made in the console is, to the memory daemon, exactly an edit made on disk:
each case of processor.py's "a person's edit wins" runs with both kinds of edit."""

import asyncio
from collections.abc import Callable

import pytest

from devkit.mock_bridge import Fault
from sprite_os.console import memory_files
from sprite_os.errors import EditConflict
from sprite_os.memory.files import sha
from tests.test_processor import Kit, kit  # noqa: F401  (kit is the fixture)

EDITED = "# User\n- Prefers 'Dr. Lovelace' (edited by a person)\n"


def on_disk(k: Kit) -> None:
    k.files.path("user.md").write_text(EDITED)


def in_the_console(k: Kit) -> None:  # what the console's memory_edit request does
    memory_files.edit(k.files, "user.md", EDITED, sha(k.files.read("user.md")))


EDITS = pytest.mark.parametrize("edit", [on_disk, in_the_console], ids=["on-disk", "console"])


@EDITS
async def test_an_edit_during_the_call_wins(kit: Kit, edit: Callable[[Kit], None]) -> None:  # noqa: F811
    kit.files.write("user.md", "# User\n", source="seed")
    obs = await kit.turns("call me Ada")
    kit.bridge.faults.add(Fault("latency", seconds=1.0, target="curator", times=1))
    kit.bridge.curator.script("FACT: Name is Ada\nUSER_MD_UPDATE:\n# User\n- Ada\n")
    call = asyncio.create_task(kit.processor.process(obs, "batch"))
    await kit.bridge.wait_for(lambda b: len(b.curator_requests()) == 1)  # the files were read; the call is slow
    edit(kit)
    with pytest.raises(EditConflict):
        await call
    assert kit.files.read("user.md") == EDITED
    assert await kit.transcript.call(lambda t: t.counts()["pending"]) == 1  # it runs again, on the edit
    kit.bridge.curator.script("FACT: Name is Ada\nUSER_MD_UPDATE:\n# User\n- Ada, 'Dr. Lovelace'\n")
    await kit.processor.process(await kit.processor.pending(10), "batch", conflicts=1)
    assert "edited by a person" in kit.bridge.curator_requests()[1].last_user_text


@EDITS
async def test_an_edit_just_before_the_write_supersedes_the_batch(kit: Kit, edit: Callable[[Kit], None],  # noqa: F811
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    kit.files.write("user.md", "# User\n", source="seed")
    obs = await kit.turns("call me Ada")
    write = kit.files.write

    def person_edits_first(name: str, text: str, source: str, expect: str | None = None) -> object:
        monkeypatch.setattr(kit.files, "write", write)  # once: the person edits just before the write
        edit(kit)
        return write(name, text, source, expect)

    monkeypatch.setattr(kit.files, "write", person_edits_first)
    kit.bridge.curator.script("FACT: Name is Ada\nUSER_MD_UPDATE:\n# User\n- Name: Ada\n")
    with pytest.raises(EditConflict):
        await kit.processor.process(obs, "batch")
    assert kit.files.read("user.md") == EDITED
    assert [b.status for b in await kit.memory.call(lambda m: m.recent_batches(5))] == ["superseded"]
    assert await kit.transcript.call(lambda t: t.counts()["pending"]) == 1
