"""Driving the console in a real headless Chromium: the distribution's headless shell (make test
installs it when missing) through Playwright, against the real server and CLI with the mock
Bridge. Every page records its console errors and uncaught exceptions; a test ends by
asserting there were none (a CSP violation is a console error too).

One Chromium serves every browser test of a pytest worker: a launch with its Playwright driver costs
about 1 s of CPU, a browser context about 0.2 s. Playwright's objects belong to the event loop that
made them, so those tests, and their function-scoped fixtures, run on the worker's session loop
(tests/conftest.py's `_function_scoped_runner`, for every module that imports `chromium`); each test
still has its own browser contexts (cookies, storage, routes), closed when its `chromium()` ends, and
the tasks it left on the loop are cancelled as a loop of its own would have. A browser that crashed
is launched again for the next test; the worker closes it when its session ends.

The browser's temporary folders (Playwright's profile and artifacts folders, Chromium's own temp files)
go into a folder of the worker's, under the run's temp folder, removed when the session ends: in /tmp,
a browser killed (a test does) or a driver cut short would leave them behind.

Screenshots go to a scratch folder, or to docs/console/ with SPRITE_CONSOLE_SCREENSHOTS set
(`make screenshots`), so that `make test` leaves the checkout as it found it.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from playwright.async_api import (
    Browser,
    BrowserContext,
    Page,
    Playwright,
    WebSocketRoute,
    async_playwright,
    expect,
)

from devkit.harness import TOKEN, make_settings, running
from devkit.mock_bridge import MockBridge
from sprite_os import gateway
from sprite_os.config import Settings
from sprite_os.memory.files import SPECS, MemoryFiles
from sprite_os.server import SpriteOS
from tests.conftest import wait_for

CHROMIUM = os.environ.get("SPRITE_TEST_CHROMIUM", "/usr/lib/chromium/chromium-headless-shell")  # not /usr/bin's wrapper (Makefile)
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
UI_TIMEOUT = 30_000  # ms: a turn through the real CLI on a loaded two-core machine

expect.set_options(timeout=UI_TIMEOUT)


@asynccontextmanager
async def chromium() -> AsyncIterator[Browser]:
    """The worker's Chromium, on its loop; a browser of its own for a test on another loop. The browser
    contexts opened through it are closed when it ends, as a closed browser's would be."""
    shared = _SHARED
    if shared is None or shared.runner.get_loop() is not asyncio.get_running_loop():
        with scratch(shared.root if shared is not None else None) as folder:
            pw = await _start(folder)
            try:
                browser = await _launch(pw)
                try:
                    yield browser
                finally:
                    await browser.close()
            finally:
                await pw.stop()
        return
    browser = await shared.ready()
    try:
        yield browser
    finally:
        await _close_contexts(browser)


class WorkerBrowser:
    """The worker's one Chromium and the loop it lives on (pytest-asyncio's session runner); its temporary
    folders in `folder`."""

    def __init__(self, runner: asyncio.Runner, root: Path, folder: Path) -> None:
        self.runner, self.root, self.folder = runner, root, folder
        self._playwright: Playwright | None = None
        self._browser: Browser | None = None
        self._own: set[asyncio.Task[Any]] = set()  # the driver's tasks, which outlive every test

    async def ready(self) -> Browser:
        """The browser, launched at the first call and again after a crash."""
        if self._browser is not None and self._browser.is_connected():
            return self._browser
        await self._close()
        before = asyncio.all_tasks()
        self._playwright = await _start(self.folder)
        self._browser = await _launch(self._playwright)
        self._own |= asyncio.all_tasks() - before
        return self._browser

    def test(self) -> Iterator[asyncio.Runner]:
        """One test's use of the loop: what it leaves running is cancelled after its fixtures' teardown."""
        self.runner.run(self.ready())
        before = self.runner.run(_tasks())
        yield self.runner
        self.runner.run(self._cancel_all_but(before))

    async def _cancel_all_but(self, before: set[asyncio.Task[Any]]) -> None:
        if self._browser is not None:  # a test that opened a context outside `chromium()`
            await _close_contexts(self._browser)
        self._own = {task for task in self._own if not task.done()}
        left = asyncio.all_tasks() - before - self._own - {asyncio.current_task()}
        for task in left:
            task.cancel()
        await asyncio.gather(*left, return_exceptions=True)

    async def _close(self) -> None:
        if self._browser is not None:
            await self._browser.close()  # a crashed browser's close only forgets it
        if self._playwright is not None:
            await self._playwright.stop()
        self._browser = self._playwright = None

    def close(self) -> None:
        self.runner.run(self._close())


_SHARED: WorkerBrowser | None = None


@contextmanager
def worker_browser(runner: asyncio.Runner, root: Path) -> Iterator[WorkerBrowser]:
    """The worker's browser for the session (tests/conftest.py), its temporary folders under `root` (the
    run's temp folder), closed at its end: no Chromium left, nor a folder of its."""
    global _SHARED
    with scratch(root) as folder:
        before, _SHARED = _SHARED, WorkerBrowser(runner, root, folder)
        try:
            yield _SHARED
        finally:
            _SHARED.close()
            _SHARED = before


# Chromium's ProcessSingleton socket, in its temp folder: `<TMPDIR>/org.chromium.Chromium.XXXXXX/SingletonSocket`,
# whose path a Unix socket's address must hold (107 bytes), or Chromium will not start.
_SOCKET_IN_TMPDIR = len("/org.chromium.Chromium.XXXXXX/SingletonSocket")
_SOCKET_PATH_MAX = 107


@contextmanager
def scratch(root: Path | None) -> Iterator[Path]:
    """A folder of a browser's own under `root`, removed at the end; in the system's temp folder if None, or
    if a folder under `root` would make the path of Chromium's socket too long."""
    if root is not None and len(os.fsencode(root)) + len("/b-xxxxxxxx") + _SOCKET_IN_TMPDIR > _SOCKET_PATH_MAX:
        root = None
    folder = Path(tempfile.mkdtemp(prefix="b-", dir=root))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def drives_a_browser(module: object) -> bool:
    """A test module that drives the console through `chromium()` (so runs on the worker's loop)."""
    return getattr(module, "chromium", None) is chromium


async def browser_pid(browser: Browser) -> int:
    """The browser's own process (its renderers and helpers are its children)."""
    session = await browser.new_browser_cdp_session()
    try:
        info = await session.send("SystemInfo.getProcessInfo")
    finally:
        await session.detach()
    return int(next(p["id"] for p in info["processInfo"] if p["type"] == "browser"))


async def _close_contexts(browser: Browser) -> None:
    if browser.is_connected():  # a crashed browser's are gone with it
        for context in browser.contexts:
            await context.close()


async def _start(folder: Path) -> Playwright:
    """Playwright's driver with `folder` as its TMPDIR, so the profile and artifacts folders it makes for a
    launch go there; the browser inherits the driver's environment, so its own temp files do too. The
    driver takes this process's environment at its start (Playwright has no option for it)."""
    with mock.patch.dict(os.environ, {"TMPDIR": str(folder)}):
        return await async_playwright().start()


async def _launch(pw: Playwright) -> Browser:
    if not Path(CHROMIUM).exists() and shutil.which(CHROMIUM) is None:
        pytest.fail(f"no Chromium at {CHROMIUM}: `make test` installs it "
                    "(apt-get install -y --no-install-recommends chromium-headless-shell), or set SPRITE_TEST_CHROMIUM")
    return await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


async def _tasks() -> set[asyncio.Task[Any]]:
    return asyncio.all_tasks() - {asyncio.current_task()}  # type: ignore[operator]


# A failure of a test's own checks: an assertion, a timeout, a `pytest.fail`. `pytest.exit`, a skip and what
# is not an Exception (KeyboardInterrupt, a cancellation) are no test's own: they go to the run.
_CHECK_FAILURE = (Exception, pytest.fail.Exception)


class Scenario:
    """One run whose parts several tests assert (a CLI's start, a server's, a restart paid once for them):
    made by the first of those tests to ask for its verdict, on the worker's loop, the others reading what
    it found. `blocks` names the tests and how many blocks of checks each has in the run: each block runs
    inside the run, at its place in it (`async with scenario.checks(name)`), and what failed there is that
    test's failure, raised when it asks (`await scenario.verdict(name)`). A test passes once its last block
    has passed, and every block before it; a block more than it has fails it.

    What breaks the run outside a test's checks fails every test that had not passed its last block, naming
    the error; an error after every test's last block (a server's stop, the browser's close) fails the test
    that finished last (a test that failed its own checks fails with that failure, the break added to it as a
    note). A `pytest.fail` in the run fails those tests with its message, a `pytest.skip` skips
    them; a KeyboardInterrupt or a cancellation goes on up. The run is given settings on a workspace in
    `folder` and their mock Bridge, its own: the tests take no server of their own. A module-scoped fixture
    holds it, and its tests share an `xdist_group`, so that one worker runs it once (spread over workers,
    each would run it whole)."""

    def __init__(self, run: Callable[[Scenario, Settings, MockBridge], Awaitable[None]], folder: Path,
                 blocks: Mapping[str, int]) -> None:
        self._run, self._folder, self._blocks = run, folder, dict(blocks)
        self._ran = False
        self._seen: dict[str, int] = {}  # blocks begun, by test
        self._failed: dict[str, BaseException] = {}  # a test's first failure
        self._finished: list[str] = []  # the tests whose last block ran, in the run's order
        self._broken: BaseException | None = None

    @asynccontextmanager
    async def checks(self, name: str) -> AsyncIterator[None]:
        if name not in self._blocks:
            raise KeyError(f"{name!r} is none of the scenario's tests: {', '.join(self._blocks)}")
        n = self._seen[name] = self._seen.get(name, 0) + 1
        if n > self._blocks[name]:
            self._failed.setdefault(name, AssertionError(
                f"the run has a block {n} of checks for {name}, which has {self._blocks[name]}"))
        try:
            yield
        except pytest.exit.Exception:
            raise
        except _CHECK_FAILURE as exc:  # kept for the test it belongs to; the run goes on
            self._failed.setdefault(name, exc)
        if n == self._blocks[name]:
            self._finished.append(name)

    async def verdict(self, name: str) -> None:
        """What `name`'s checks found; the run made first if it was not."""
        if name not in self._blocks:
            pytest.fail(f"{name!r} is none of the scenario's tests: {', '.join(self._blocks)}")
        if not self._ran:
            self._ran = True
            try:
                async with MockBridge() as bridge:
                    await self._run(self, make_settings(self._folder / "workspace", bridge.url), bridge)
            except pytest.exit.Exception:
                raise
            except (*_CHECK_FAILURE, pytest.skip.Exception) as exc:
                self._broken = exc
            except BaseException as exc:  # an interrupt, a cancellation: not the tests', and on up
                self._broken = exc
                raise
        broke = self._broke_for(name)
        if name in self._failed:
            failure = self._failed[name]
            if broke is not None:
                failure.add_note(broke)
            raise failure
        if broke is not None:
            raise pytest.fail.Exception(broke) from self._broken
        if name in self._finished:
            return
        if isinstance(self._broken, pytest.skip.Exception):
            pytest.skip(self._broken.msg)
        pytest.fail(f"the run never reached the last checks of {name} ({self._begun(name)})")

    def _broke_for(self, name: str) -> str | None:
        """What the run's break says of `name`: it cut the test short, or it came after every test's last
        checks and `name`'s were the last to finish (a stop, a close: no test's, and failing one)."""
        broken = self._broken
        if broken is None or isinstance(broken, pytest.skip.Exception):
            return None
        if name not in self._finished:
            return f"the run broke before the last checks of {name} ({self._begun(name)}): {_said(broken)}"
        if name == self._finished[-1] and set(self._finished) == set(self._blocks):
            return f"the run broke after the last checks of every test, this one's last: {_said(broken)}"
        return None

    def _begun(self, name: str) -> str:
        return f"block {self._seen.get(name, 0)} of {self._blocks[name]} begun"


def _said(exc: BaseException) -> str:
    """An error as a failure names it: a `pytest.fail`'s message, or the error's type and words."""
    if isinstance(exc, pytest.fail.Exception):
        return str(exc.msg)
    return f"{type(exc).__name__}: {exc}"


Part = Callable[[SpriteOS, MockBridge], Awaitable[None]]
IDLE_WAIT = 30.0  # s: for the server to be idle after a part, and again once what it left is interrupted


def part_name(part: Part) -> str:
    """A part's name, its test's: its function's, and the arguments bound to it (`functools.partial`)."""
    if isinstance(part, functools.partial):
        return "-".join([part.func.__name__, *map(str, part.keywords.values())])
    return part.__name__  # type: ignore[attr-defined]


def on_one_server(parts: list[Part], folder: Path) -> Scenario:
    """Tests that each need a server and its CLI but no restart, run one after another on one server (its
    CLI started once): each part with pages of its own, closed at its end, and its own
    words (a page shows the session's earlier turns too). A part's failure is its test's. A part but the
    last must leave the server idle, nothing queued, for the next (waited for, in its checks: an answer is
    shown before its turn ends): one that does not fails for it, and what it left running is interrupted,
    so that the next part starts on an idle server all the same."""
    names = [part_name(part) for part in parts]

    async def run(scenario: Scenario, settings: Settings, bridge: MockBridge) -> None:
        async with running(settings) as server:
            runtime = server.runtime

            def idle() -> bool:
                return bool(runtime.state == "idle" and runtime.queued == 0)

            for n, (name, part) in enumerate(zip(names, parts, strict=True)):
                last = n == len(parts) - 1
                async with scenario.checks(name):
                    await part(server, bridge)
                    if not last:
                        await wait_for(idle, timeout=IDLE_WAIT,
                                       what=f"the server idle after the part {name} (no turn running, none queued)")
                if not last and not idle():
                    await wait_for(functools.partial(_interrupted, runtime), timeout=IDLE_WAIT, interval=0.2,
                                   what=f"the server idle once the turns the part {name} left were interrupted")

    return Scenario(run, folder, dict.fromkeys(names, 1))


def one_server_tests(parts: list[Part], group: str) -> tuple[Any, Any]:
    """A module's `one_server` fixture and its `test_on_one_server` (each part a test of its own, named after
    it), run by `on_one_server` in the xdist group `group`, so in one worker. In the module:
    `one_server, test_on_one_server = one_server_tests(ON_ONE_SERVER, "my-group")`."""

    @pytest.fixture(scope="module")
    def one_server(tmp_path_factory: pytest.TempPathFactory) -> Scenario:
        return on_one_server(parts, tmp_path_factory.mktemp("one-server"))

    @pytest.mark.xdist_group(group)  # one run: on one worker
    @pytest.mark.parametrize("part", [part_name(part) for part in parts])
    async def test_on_one_server(one_server: Scenario, part: str) -> None:
        """Each part (its docstring says what it asserts), a test of its own."""
        await one_server.verdict(part)

    return one_server, test_on_one_server


async def _interrupted(runtime: Any) -> bool:
    """Whether the runtime is idle, nothing queued; its running turn interrupted if not (each queued one's next)."""
    if runtime.state == "idle" and runtime.queued == 0:
        return True
    await runtime.interrupt()
    return False


@dataclass
class Tab:
    """One browser tab on the console, with what it logged and every socket it opened."""

    page: Page
    base: str
    problems: list[str] = field(default_factory=list)
    sockets: list[float] = field(default_factory=list)  # when Playwright told of each WebSocket (ms, this process's clock)
    auth_checks: int = 0

    def by(self, testid: str) -> Any:
        return self.page.get_by_test_id(testid)

    async def sign_in(self, token: str = TOKEN) -> None:
        await self.page.goto(self.base)
        await self.by("token-input").fill(token)
        await self.by("token-submit").click()

    async def socket_times(self) -> list[float]:
        """When the page made each WebSocket since it loaded, by its own clock (ms): gaps between them
        are the page's, not when a busy test process heard of them."""
        return list(await self.page.evaluate("window.__socketsMade"))

    async def connected(self) -> None:
        await expect(self.by("connection-status")).to_have_attribute("data-state", "connected")

    async def send(self, text: str) -> None:
        await self.by("composer").fill(text)
        await self.by("send-button").click()

    def messages(self, role: str) -> Any:
        return self.page.locator(f'[data-testid="message"][data-role="{role}"]')

    async def memory(self, section: str) -> None:
        await self.by("memory-tab").click()
        await self.by(f"memory-section-{section}").click()
        await expect(self.by(f"memory-panel-{section}")).not_to_have_attribute("data-loading", "true")

    def assert_clean(self, *expected: str) -> None:
        """No console error or page error, but those containing one of `expected` (a refused
        socket or a 401 is logged by the browser itself); never a Content-Security-Policy one."""
        unexpected = [p for p in self.problems if not any(e in p for e in expected) or "Security Policy" in p]
        assert unexpected == [], unexpected


async def open_tab(browser: Browser, base: str, *, viewport: dict[str, int] = DESKTOP,
                   dark: bool = False) -> Tab:
    context: BrowserContext = await browser.new_context(viewport=viewport,  # type: ignore[arg-type]
                                                        color_scheme="dark" if dark else "light")
    await context.add_init_script(_COUNT_SOCKETS)
    return await _watched(context, base)


async def same_browser_tab(tab: Tab) -> Tab:
    """Another tab of `tab`'s browser (its context: the same localStorage, as a person's second tab)."""
    return await _watched(tab.page.context, tab.base)


async def _watched(context: BrowserContext, base: str) -> Tab:
    page = await context.new_page()
    tab = Tab(page, base)
    page.on("console", lambda m: tab.problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: tab.problems.append(f"page error: {e}"))
    page.on("websocket", lambda _ws: tab.sockets.append(_now_ms()))
    page.on("request", lambda r: setattr(tab, "auth_checks", tab.auth_checks + 1) if r.url.endswith("/console/auth") else None)
    return tab


async def signed_in(browser: Browser, port: int, *, route: Callable[[WebSocketRoute], None] | None = None) -> Tab:
    """A tab signed in and connected; `route` sees its socket first (to hold an answer back)."""
    tab = await open_tab(browser, f"http://127.0.0.1:{port}/")
    if route is not None:
        await tab.page.route_web_socket(lambda _url: True, route)
    await tab.sign_in()
    await tab.connected()
    return tab


# Before the page's own scripts: each WebSocket the page makes, stamped by the page's clock.
_COUNT_SOCKETS = """
window.__socketsMade = [];
const NativeWebSocket = window.WebSocket;
window.WebSocket = class extends NativeWebSocket {
  constructor(...args) { window.__socketsMade.push(performance.now()); super(...args); }
};
"""


def _now_ms() -> float:
    import time

    return time.monotonic() * 1000


def screenshot_dir(tmp_path: Path) -> Path:
    chosen = os.environ.get("SPRITE_CONSOLE_SCREENSHOTS")
    folder = Path(chosen) if chosen else tmp_path / "screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


async def screenshot(tab: Tab, folder: Path, name: str) -> Path:
    path = folder / f"{name}.png"
    await tab.page.screenshot(path=str(path), animations="disabled", caret="hide")
    assert path.stat().st_size > 10_000  # a rendered page, not a blank one
    return path


TEMPLATES = Path(__file__).resolve().parent.parent / "bootstrap" / "templates"


def install_templates(settings: Settings) -> None:
    """What a deploy does (`sprite-os install-templates`), so the memory tab looks as on a Sprite."""
    files = MemoryFiles(settings.layout)
    for name in SPECS:
        files.install_template(name, (TEMPLATES / name).read_text(encoding="utf-8"), "deploy")


def intercepted(monkeypatch: pytest.MonkeyPatch,
                handle: Callable[[gateway._Connection, str], Awaitable[bool]]) -> None:
    """Each text frame a page sends goes first to `handle(conn, message)`, which answers or drops it itself
    (True), or leaves it to the server (False). Stacks: a later one sees the frames first."""
    receive = gateway._Connection._receive

    async def read(conn: gateway._Connection, message: str | bytes) -> None:
        if isinstance(message, str) and await handle(conn, message):
            return
        await receive(conn, message)

    monkeypatch.setattr(gateway._Connection, "_receive", read)


def refused(monkeypatch: pytest.MonkeyPatch, matches: Callable[[str], bool], code: str, message: str) -> None:
    """The frames `matches` picks are answered with the error `code` (and `message`), never handled."""
    async def refuse(conn: gateway._Connection, frame: str) -> bool:
        if not matches(frame):
            return False
        conn._error(code, message, json.loads(frame)["request_id"])
        return True

    intercepted(monkeypatch, refuse)


class HeldFrames:
    """The frames a page sends that `matches` picks, read by the server only when the test releases them
    (a slow link for those alone): each waits in a task of its own, so the socket's later frames are read
    meanwhile, and a released one is handled as if it had just come. `held` lists them in arrival order;
    `on` off, nothing more is held."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, matches: Callable[[str], bool], *, on: bool = True) -> None:
        self.matches, self.on = matches, on
        self.held: list[tuple[asyncio.Event, asyncio.Task[None]]] = []
        receive = gateway._Connection._receive

        async def when_released(conn: gateway._Connection, message: str, go: asyncio.Event) -> None:
            await go.wait()
            await receive(conn, message)

        async def hold(conn: gateway._Connection, message: str) -> bool:
            if not (self.on and self.matches(message)):
                return False
            go = asyncio.Event()
            self.held.append((go, asyncio.create_task(when_released(conn, message, go))))
            return True

        intercepted(monkeypatch, hold)

    async def release(self, *which: int) -> None:
        """The held frames `which` (all, if none named), in that order, each handled before the next."""
        for index in which or range(len(self.held)):
            go, handled = self.held[index]
            go.set()
            await asyncio.wait_for(handled, 30)


class HoldBack:
    """Sits on the page's socket and holds back the next answer of one type, once `hold` names it,
    until `release` lets it through: an answer that comes late, after the person moved on. (Pass its
    `route` to `signed_in`. `HeldFrames` holds what the page sends, on the server's side.)"""

    def __init__(self) -> None:
        self.kind: str | None = None
        self.held: list[str] = []
        self.sockets: list[WebSocketRoute] = []

    def route(self, page_side: WebSocketRoute) -> None:
        server_side = page_side.connect_to_server()

        def to_page(message: str | bytes) -> None:
            if self.kind and isinstance(message, str) and f'"{self.kind}"' in message:
                self.kind = None
                self.held.append(message)
            else:
                page_side.send(message)
        server_side.on_message(to_page)
        self.sockets.append(page_side)

    async def hold(self, kind: str, action: Awaitable[None]) -> None:
        """Hold the next `kind` answer, do `action` (which asks for it), and wait until it is held."""
        self.kind = kind
        await action
        await wait_for(lambda: len(self.held) == 1, timeout=30, what=f"the {kind}, held")

    def release(self) -> None:
        self.sockets[-1].send(self.held.pop())
