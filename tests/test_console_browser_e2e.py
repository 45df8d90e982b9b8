"""The browser tests' one Chromium per worker (tests/console_browser.py): each test's browser
contexts are its own and closed at its end, a crashed browser is launched again, and the worker's
browser leaves no process behind."""

from __future__ import annotations

import asyncio
import os
from signal import SIGKILL

import pytest

from devkit.harness import wait_for
from devkit.processes import pid_alive
from tests.console_browser import browser_pid, chromium, worker_browser

pytestmark = pytest.mark.e2e

ORIGIN = "http://127.0.0.1:9/"  # only named, never reached: cookies belong to an origin


async def test_a_tests_contexts_are_its_own_and_a_crashed_browser_is_launched_again() -> None:
    async with chromium() as browser:
        context = await browser.new_context()
        await context.add_cookies([{"name": "seen", "value": "1", "url": ORIGIN}])
        assert len(await context.cookies()) == 1
    assert browser.contexts == []  # closed with its `chromium()`
    async with chromium() as same:
        assert same is browser  # the worker's, not a launch of its own
        context = await same.new_context()
        assert await context.cookies() == []
        os.kill(await browser_pid(same), SIGKILL)
        await wait_for(lambda: not same.is_connected(), 30, what="the killed browser's disconnection")
    async with chromium() as again:
        assert again is not browser and again.is_connected()
        page = await (await again.new_context()).new_page()
        await page.set_content("<p>up</p>")
        assert await page.text_content("p") == "up"


def test_the_workers_browser_leaves_no_process_when_it_is_closed() -> None:
    with asyncio.Runner() as runner:
        with worker_browser(runner) as worker:
            pid = runner.run(browser_pid(runner.run(worker.ready())))
            assert pid_alive(pid)
        assert not pid_alive(pid)
