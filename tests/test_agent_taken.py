"""agent/taken.py: the client ids of the messages taken, bounded, newest kept."""

from __future__ import annotations

from sprite_os.agent.taken import Taken, TakenIds


def test_an_id_taken_is_known_with_where_it_ran_and_another_is_not() -> None:
    ids = TakenIds()
    ids.add(Taken("web-1", turn_id="t-1"))
    assert ids.get("web-1") == Taken("web-1", None, "t-1")
    assert ids.get("web-2") is None


def test_past_the_bound_the_oldest_id_is_forgotten() -> None:
    ids = TakenIds(limit=3)
    ids.seed([Taken("r-2", "s"), Taken("r-1", "s")])  # the record's, newest first
    for n in range(2):
        ids.add(Taken(f"web-{n}"))
    assert len(ids) == 3
    assert ids.get("r-1") is None and ids.get("r-2") is not None and ids.get("web-1") is not None


def test_a_seed_fills_only_the_room_left_and_keeps_what_was_taken_since() -> None:
    ids = TakenIds(limit=3)
    ids.add(Taken("web-1", turn_id="t-live"))
    ids.seed([Taken("web-1", "s-old", "t-old"), Taken("r-2", "s"), Taken("r-1", "s"), Taken("r-0", "s")])
    assert len(ids) == 3 and ids.get("r-0") is None
    assert ids.get("web-1") == Taken("web-1", None, "t-live")
    ids.add(Taken("web-2"))  # the oldest the record held goes first
    assert ids.get("r-1") is None and ids.get("r-2") is not None
