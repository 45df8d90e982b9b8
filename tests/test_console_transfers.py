"""What downloads and uploads share (console/transfers.py): the connection that owns a transfer, a
thread's work seen through to its end, one held while still the same one, a refused path told as
the request's error."""

from __future__ import annotations

import asyncio
import threading

import pytest

from sprite_os.console import requests as rq
from sprite_os.console import transfers
from sprite_os.console.user_files import NotThere, PathRefused


def _as(key: str, owner: transfers.Owner, room: list[str] | None = None) -> None:
    token = rq.client.set(key)
    try:
        owner.take("download", (lambda: room.append(key)) if room is not None else lambda: None)
    finally:
        rq.client.reset(token)


def test_a_transfer_is_its_connections_until_that_one_ends_then_the_first_to_ask_takes_it() -> None:
    owner, room = transfers.Owner("c1"), []
    _as("c1", owner, room)  # its own connection: no takeover
    with pytest.raises(rq.RequestFailed) as refused:
        _as("c2", owner, room)
    assert refused.value.code == "busy" and owner.client == "c1"
    assert not owner.ended("c2") and owner.ended("c1")
    _as("c2", owner, room)  # c1 ended: c2 takes it over, its share asked first
    assert owner.client == "c2" and not owner.left and room == ["c2"]
    with pytest.raises(rq.RequestFailed):
        _as("c3", owner)  # c2 owns it now, and has not ended


def test_a_refused_path_is_bad_path_and_a_missing_one_not_found() -> None:
    assert transfers.refused(PathRefused("outside user space")).code == "bad_path"
    assert transfers.refused(NotThere("no such file")).code == "not_found"


async def test_a_cancelled_caller_still_waits_for_the_threads_work_to_end() -> None:
    release, done = threading.Event(), threading.Event()

    def work() -> None:
        release.wait(10)
        done.set()

    waiting = asyncio.ensure_future(transfers.settled(asyncio.to_thread(work)))
    await asyncio.sleep(0.05)
    waiting.cancel()
    await asyncio.sleep(0.05)
    assert not waiting.done()  # cancelled, but the thread still holds the descriptor
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert done.is_set()


async def test_a_transfer_held_is_the_one_still_open_once_its_lock_is_taken() -> None:
    class Transfer:
        def __init__(self) -> None:
            self.lock = asyncio.Lock()

    first, gone = Transfer(), rq.RequestFailed("not_found", "gone")
    open_: dict[str, Transfer] = {"t": first}
    taken: list[Transfer] = []
    async with transfers.held(open_, "t", gone, taken.append) as held:
        assert held is first and taken == [first]
    with pytest.raises(rq.RequestFailed):
        async with transfers.held(open_, "missing", gone):
            pass
    await first.lock.acquire()  # another operation holds it, and closes it (a new one under the same key)
    waiting = asyncio.ensure_future(transfers.held(open_, "t", gone).__aenter__())
    await asyncio.sleep(0)
    open_["t"] = Transfer()
    first.lock.release()
    with pytest.raises(rq.RequestFailed):
        await waiting
