"""Canvas cards: validated tools, persisted state, every change broadcast."""

import json
from pathlib import Path
from typing import Any

import pytest

from sprite_os import protocol as p
from sprite_os.tools.canvas import MAX_OPEN_CARDS, CanvasStore, canvas_tools


@pytest.fixture
def published() -> list[p.ServerFrame]:
    return []


@pytest.fixture
def store(tmp_path: Path, published: list[p.ServerFrame]) -> CanvasStore:
    s = CanvasStore(tmp_path / "state" / "canvas.json", published.append)
    s.load()
    return s


async def call(store: CanvasStore, name: str, args: dict[str, Any]) -> dict[str, Any]:
    tool = next(t for t in canvas_tools(store) if t.name == name)
    return await tool.handler(args)


async def test_create_update_close_list(store: CanvasStore, published: list[p.ServerFrame]) -> None:
    created = await call(store, "create_card", {"title": "Groceries", "body": "- milk", "kind": "task"})
    card = json.loads(created["content"][0]["text"])
    assert card["id"] == "groceries" and not created.get("is_error")
    await call(store, "update_card", {"id": "groceries", "body": "- milk\n- eggs"})
    listed = json.loads((await call(store, "list_cards", {}))["content"][0]["text"])
    assert [(c["title"], c["body"], c["kind"]) for c in listed] == [("Groceries", "- milk\n- eggs", "task")]
    await call(store, "close_card", {"id": "groceries"})
    assert store.cards() == []
    assert [type(f).__name__ for f in published] == ["CardCreated", "CardUpdated", "CardClosed"]


async def test_ids_are_unique_and_derived_from_titles(store: CanvasStore) -> None:
    for _ in range(3):
        await call(store, "create_card", {"title": "Q3 Report!"})
    assert [c.id for c in store.cards()] == ["q3-report", "q3-report-2", "q3-report-3"]


@pytest.mark.parametrize(("name", "args", "needle"), [
    ("create_card", {}, "title"),
    ("create_card", {"title": ""}, "length"),
    ("create_card", {"title": "x", "kind": "poster"}, "kind"),
    ("create_card", {"title": "x", "id": "Bad Id!"}, "id"),
    ("create_card", {"title": "x", "colour": "red"}, "colour"),
    ("update_card", {"id": "nope", "title": "y"}, "no open card"),
    ("close_card", {"id": "nope"}, "no open card"),
])
async def test_bad_input_is_an_error_the_model_can_act_on(store: CanvasStore, name: str, args: dict[str, Any],
                                                           needle: str) -> None:
    result = await call(store, name, args)
    assert result["is_error"] is True
    assert needle in result["content"][0]["text"]


async def test_duplicate_id_and_too_many_cards(store: CanvasStore) -> None:
    await call(store, "create_card", {"title": "a", "id": "fixed"})
    assert "already open" in (await call(store, "create_card", {"title": "b", "id": "fixed"}))["content"][0]["text"]
    for n in range(MAX_OPEN_CARDS - 1):
        await call(store, "create_card", {"title": f"card {n}"})
    full = await call(store, "create_card", {"title": "one too many"})
    assert full["is_error"] and "close some" in full["content"][0]["text"]


async def test_cards_survive_a_restart_and_a_damaged_file_is_set_aside(tmp_path: Path) -> None:
    path = tmp_path / "canvas.json"
    first = CanvasStore(path, lambda f: None)
    first.load()
    await call(first, "create_card", {"title": "Keep me"})
    second = CanvasStore(path, lambda f: None)
    second.load()
    assert [c.title for c in second.cards()] == ["Keep me"]
    path.write_text("{not json")
    third = CanvasStore(path, lambda f: None)
    third.load()
    assert third.cards() == []
    assert any(p.name.startswith("canvas.json.damaged-") for p in tmp_path.iterdir())


async def test_a_failed_save_changes_nothing(store: CanvasStore, published: list[p.ServerFrame],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from sprite_os.tools import canvas

    def disk_full(*_: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(canvas, "atomic_write", disk_full)
    result = await call(store, "create_card", {"title": "Groceries \ud83d"})  # a lone surrogate, too
    assert result["is_error"] is True
    assert store.cards() == [] and published == []


async def test_a_person_closes_a_card_from_the_console(store: CanvasStore, published: list[p.ServerFrame]) -> None:
    from sprite_os.console.card_frames import CardCloseRequest
    from sprite_os.console.cards import CardsConsole
    from sprite_os.console.requests import RequestFailed

    await call(store, "create_card", {"title": "Groceries"})
    close = CardsConsole(store).handlers[CardCloseRequest]
    done = await close(CardCloseRequest(request_id="r", card_id="groceries"))
    assert done.card_id == "groceries" and store.cards() == []  # type: ignore[attr-defined]
    assert published[-1] == p.CardClosed(card_id="groceries")  # every client sees it close
    with pytest.raises(RequestFailed) as gone:
        await close(CardCloseRequest(request_id="r", card_id="groceries"))
    assert gone.value.code == "not_found"
