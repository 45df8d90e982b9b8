"""The browser tests' one Chromium per worker (tests/console_browser.py): each test's browser
contexts are its own and closed at its end, a crashed browser is launched again, and the worker's
browser leaves no process behind, nor a folder in /tmp, even killed."""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path
from signal import SIGKILL

import pytest

from devkit.harness import wait_for
from devkit.processes import pid_alive
from tests.console_browser import WorkerBrowser, browser_pid, chromium, scratch, worker_browser

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


def test_the_workers_browser_leaves_no_process_when_it_is_closed(tmp_path: Path) -> None:
    with asyncio.Runner() as runner:
        with worker_browser(runner, tmp_path) as worker:
            pid = runner.run(browser_pid(runner.run(worker.ready())))
            assert pid_alive(pid)
        assert not pid_alive(pid)


async def folders_of(worker: WorkerBrowser) -> set[Path]:
    """The temporary folders the worker's browser uses, read from its processes: its profile (its command
    line), Chromium's own temp folder (where its profile's SingletonSocket points, if it has one), and the
    TMPDIR of the browser and of Playwright's driver (its parent), where the driver makes the artifacts
    folder and Chromium its own temp files."""
    pid = await browser_pid(await worker.ready())
    args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    profile = Path(next(a for a in args if a.startswith(b"--user-data-dir=")).split(b"=", 1)[1].decode())
    used = {profile}
    if (profile / "SingletonSocket").is_symlink():  # the full browser's (the headless shell has none)
        used.add((profile / "SingletonSocket").readlink().parent)
    driver = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    for process in (pid, driver):
        env = dict(v.split(b"=", 1) for v in Path(f"/proc/{process}/environ").read_bytes().split(b"\0") if b"=" in v)
        used.add(Path(env.get(b"TMPDIR", b"/tmp").decode()))
    return used


def test_a_killed_browser_leaves_nothing_in_tmp(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The worker's browser keeps every temporary folder in one of the run's, removed at the session's end.
    In /tmp, where Playwright's profile and artifacts folders and Chromium's own went, a browser killed
    (as the test above does) could leave its profile behind (the full browser, its own temp folder at every
    kill), and a driver cut short the profile and the artifacts folder. What /tmp holds is not counted:
    other runs' browsers make the same kinds of entries meanwhile; every folder this browser and its driver
    use is read from their processes instead, before and after the kill."""
    with asyncio.Runner() as runner:
        with worker_browser(runner, tmp_path_factory.getbasetemp()) as worker:  # as tests/conftest.py's
            used = runner.run(folders_of(worker))
            browser = runner.run(worker.ready())
            os.kill(runner.run(browser_pid(browser)), SIGKILL)
            runner.run(wait_for(lambda: not browser.is_connected(), 30, what="the killed browser's disconnection"))
            used |= runner.run(folders_of(worker))  # launched again
            assert all(folder.is_relative_to(worker.folder) for folder in used), used
        assert not worker.folder.exists()


def test_a_browsers_folder_is_in_the_system_temp_folder_when_the_runs_would_make_its_socket_path_too_long(
        tmp_path: Path) -> None:
    """Chromium will not start when the path of its socket, in its temp folder, is longer than a socket's
    address holds."""
    with scratch(tmp_path.parent) as folder:  # the run's temp folder: short
        assert folder.parent == tmp_path.parent
    with scratch(tmp_path / ("d" * 60)) as folder:
        assert folder.parent == Path(tempfile.gettempdir())
    assert not folder.exists()
