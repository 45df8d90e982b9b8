"""The browser tests' shared runs (tests/console_browser.py's `Scenario` and `on_one_server`) with stub runs:
no browser, no server. A test of a shared run must pass only once its last checks passed; what breaks the run
fails the tests it cut short, naming what broke it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests import console_browser
from tests.console_browser import Scenario, on_one_server

Run = Callable[[Scenario], Awaitable[None]]


def shared(tmp_path: Path, run: Run, blocks: Mapping[str, int]) -> Scenario:
    async def with_settings(scenario: Scenario, _settings: object, _bridge: object) -> None:
        await run(scenario)

    return Scenario(with_settings, tmp_path, blocks)


async def outcome(scenario: Scenario, name: str) -> str:
    """`name`'s verdict as pytest would report it."""
    try:
        await scenario.verdict(name)
    except pytest.skip.Exception as exc:
        return f"skipped: {exc.msg}"
    except (Exception, pytest.fail.Exception) as exc:
        return f"failed: {exc}"
    return "passed"


async def passing(scenario: Scenario, name: str) -> None:
    async with scenario.checks(name):
        pass


async def test_an_error_after_a_tests_first_block_of_checks_fails_it(tmp_path: Path) -> None:
    """"second restart" had a block after the first restart, another after the second: the second restart
    failed, outside every block. The test passed all the same, its first block having passed."""
    async def run(scenario: Scenario) -> None:
        await passing(scenario, "done before")
        await passing(scenario, "second restart")
        raise RuntimeError("the second restart failed")

    scenario = shared(tmp_path, run, {"done before": 1, "second restart": 2, "not begun": 1})
    assert await outcome(scenario, "second restart") == (
        "failed: the run broke before the last checks of second restart (block 1 of 2 begun): "
        "RuntimeError: the second restart failed")
    assert await outcome(scenario, "not begun") == (
        "failed: the run broke before the last checks of not begun (block 0 of 1 begun): "
        "RuntimeError: the second restart failed")
    assert await outcome(scenario, "done before") == "passed"


async def test_a_test_whose_last_block_never_ran_or_which_ran_one_block_too_many_fails(tmp_path: Path) -> None:
    async def run(scenario: Scenario) -> None:
        await passing(scenario, "cut short")
        await passing(scenario, "once")
        await passing(scenario, "once")

    scenario = shared(tmp_path, run, {"cut short": 2, "once": 1})
    assert await outcome(scenario, "cut short") == (
        "failed: the run never reached the last checks of cut short (block 1 of 2 begun)")
    assert await outcome(scenario, "once") == "failed: the run has a block 2 of checks for once, which has 1"


async def test_an_error_after_every_tests_last_checks_fails_the_test_that_finished_last(tmp_path: Path) -> None:
    """The server's stop, or the browser's close, failed once every test's checks had passed: no test failed."""
    async def run(scenario: Scenario) -> None:
        await passing(scenario, "first")
        await passing(scenario, "last")
        raise RuntimeError("the server's stop failed")

    scenario = shared(tmp_path, run, {"first": 1, "last": 1})
    assert await outcome(scenario, "first") == "passed"
    assert await outcome(scenario, "last") == (
        "failed: the run broke after the last checks of every test, this one's last: "
        "RuntimeError: the server's stop failed")


async def test_a_test_that_failed_its_own_checks_names_the_break_after_them_too(tmp_path: Path) -> None:
    async def run(scenario: Scenario) -> None:
        await passing(scenario, "passed")
        async with scenario.checks("failed"):
            raise AssertionError("its own check")
        raise RuntimeError("the browser's close failed")

    scenario = shared(tmp_path, run, {"passed": 1, "failed": 1})
    assert await outcome(scenario, "passed") == "passed"
    with pytest.raises(AssertionError, match="its own check") as failure:
        await scenario.verdict("failed")
    assert failure.value.__notes__ == [
        "the run broke after the last checks of every test, this one's last: RuntimeError: the browser's close failed"]


async def test_a_skip_in_the_run_skips_the_tests_it_had_not_finished(tmp_path: Path) -> None:
    """It escaped the run and was the verdict of whichever test asked first, a test that had passed."""
    async def run(scenario: Scenario) -> None:
        await passing(scenario, "finished")
        pytest.skip("no model here")

    scenario = shared(tmp_path, run, {"finished": 1, "not begun": 1})
    assert await outcome(scenario, "finished") == "passed"
    assert await outcome(scenario, "not begun") == "skipped: no model here"


async def test_a_fail_in_the_run_fails_each_test_it_had_not_finished_with_its_message(tmp_path: Path) -> None:
    """It escaped the run and failed whichever test asked first; the others said their checks were never
    reached, not why."""
    async def run(scenario: Scenario) -> None:
        await passing(scenario, "finished")
        pytest.fail("no Chromium at /nowhere")

    scenario = shared(tmp_path, run, {"finished": 1, "b": 1, "c": 1})
    assert await outcome(scenario, "finished") == "passed"
    for name in ("b", "c"):
        assert await outcome(scenario, name) == (
            f"failed: the run broke before the last checks of {name} (block 0 of 1 begun): no Chromium at /nowhere")


async def test_a_fail_in_a_tests_checks_is_that_tests_alone_and_the_run_goes_on(tmp_path: Path) -> None:
    async def run(scenario: Scenario) -> None:
        async with scenario.checks("failing"):
            pytest.fail("its own failure")
        await passing(scenario, "after it")

    scenario = shared(tmp_path, run, {"failing": 1, "after it": 1})
    assert await outcome(scenario, "failing") == "failed: its own failure"
    assert await outcome(scenario, "after it") == "passed"


async def test_an_interrupt_in_the_run_goes_on_up(tmp_path: Path) -> None:
    async def run(scenario: Scenario) -> None:
        await passing(scenario, "finished")
        raise KeyboardInterrupt

    scenario = shared(tmp_path, run, {"finished": 1, "not begun": 1})
    with pytest.raises(KeyboardInterrupt):
        await scenario.verdict("finished")


class Runtime:
    """A server's runtime as `on_one_server` sees it: its state, its queue, its interrupt."""

    def __init__(self) -> None:
        self.state, self.queued, self.interrupts = "idle", 0, 0

    async def interrupt(self) -> bool:
        self.interrupts += 1
        self.state = "idle"
        return True


async def leaves_a_turn_running(server: Any, _bridge: object) -> None:
    server.runtime.state = "thinking"


async def finds_the_server_idle(server: Any, _bridge: object) -> None:
    assert server.runtime.state == "idle"


async def test_a_part_that_leaves_a_turn_running_on_one_server_fails_and_the_next_runs_on_an_idle_server(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The next part's wait for an idle server timed out outside every part's checks: every part after it
    failed, none naming the part that left its turn running."""
    runtime = Runtime()

    @asynccontextmanager
    async def running(_settings: object) -> AsyncIterator[SimpleNamespace]:
        yield SimpleNamespace(runtime=runtime)

    monkeypatch.setattr(console_browser, "running", running)
    monkeypatch.setattr(console_browser, "IDLE_WAIT", 0.3)
    scenario = on_one_server([leaves_a_turn_running, finds_the_server_idle], tmp_path)
    assert await outcome(scenario, "leaves_a_turn_running") == (
        "failed: not reached within 0.3 s: the server idle after the part leaves_a_turn_running "
        "(no turn running, none queued)")
    assert await outcome(scenario, "finds_the_server_idle") == "passed"
    assert runtime.interrupts == 1
