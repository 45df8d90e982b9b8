"""The suite's xdist groups hold: every test of a group runs on one worker (tests/xdist_groups.py)."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from devkit.processes import CHECKOUT as REPO
from devkit.processes import kit_env
from tests import conftest
from tests.xdist_groups import group_of, long_tests_first

TOY = '''
import os, pathlib, pytest

@pytest.mark.xdist_group("together")
@pytest.mark.parametrize("i", range(8))
def test_grouped(i):
    pathlib.Path(os.environ["SEEN"], f"grouped-{i}").write_text(os.environ["PYTEST_XDIST_WORKER"])

@pytest.mark.parametrize("i", range(8))
def test_free(i):
    pathlib.Path(os.environ["SEEN"], f"free-{i}").write_text(os.environ["PYTEST_XDIST_WORKER"])
'''


def test_a_groups_tests_all_run_on_one_worker_and_the_rest_spread(tmp_path: Path) -> None:
    (tmp_path / "test_toy.py").write_text(TOY)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    seen = tmp_path / "seen"
    seen.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.xdist_groups",
         "-n", "2", "--dist", "loadgroup", str(tmp_path)],
        cwd=tmp_path, env={**kit_env(), "SEEN": str(seen)}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    workers = {path.name: path.read_text() for path in seen.iterdir()}
    assert len(workers) == 16
    grouped = Counter(w for name, w in workers.items() if name.startswith("grouped-"))
    assert len(grouped) == 1, f"the group was spread over workers: {grouped}"
    assert set(workers.values()) == {"gw0", "gw1"}, "both workers ran tests"


pytest_plugins = ("pytester",)  # an in-process collection: a pytest process of its own costs 5 s of CPU under coverage


def test_the_deploys_real_venv_is_built_in_one_worker(pytester: pytest.Pytester) -> None:
    """Every test of the session's real venv (pip installs the lock: the costliest fixture) is in the
    `deploy` group: one in another group would build a second venv in its own worker."""
    items, _ = pytester.inline_genitems(str(REPO / "tests" / "test_deploy.py"), "-p", "no:cacheprovider")
    of_the_venv = {item.name: group_of(item) for item in items if "venv" in item.fixturenames}
    assert len(of_the_venv) >= 10
    assert {name: group for name, group in of_the_venv.items() if group != "deploy"} == {}


@pytest.mark.parametrize("shared", [True, False])
def test_the_agent_users_tests_run_one_at_a_time_only_when_the_workers_share_that_user(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, shared: bool) -> None:
    """SPRITE_TEST_AGENT_USER names one user for every worker: a start as that user ends its every process,
    another worker's agent included, so those tests run in the `host` group. Else each worker's user is its
    own, and they spread (the red team's user mode stays together for its one module-wide server)."""
    monkeypatch.setattr(conftest, "USERS_SHARED", shared)
    items, _ = pytester.inline_genitems(*(str(REPO / "tests" / name) for name in (
        "test_isolation_e2e.py", "test_limits_e2e.py", "test_isolation_redteam_e2e.py")), "-p", "no:cacheprovider")
    as_user = {item.nodeid: group_of(item) for item in items
               if "agent_user" in item.fixturenames or "[user" in item.nodeid}
    assert sum("[user" in nodeid for nodeid in as_user) >= 50 and len(as_user) >= 60
    if shared:
        assert set(as_user.values()) == {"host"}
    else:
        assert {nodeid: group for nodeid, group in as_user.items()
                if group != ("redteam-user" if "[user" in nodeid else None)} == {}


class Marked:
    """What the plugin reads of a test: its marks."""

    def __init__(self, name: str, *marks: pytest.MarkDecorator) -> None:
        self.name, self.marks = name, [decorator.mark for decorator in marks]

    def iter_markers(self, name: str) -> list[pytest.Mark]:
        return [mark for mark in self.marks if mark.name == name]

    def get_closest_marker(self, name: str) -> pytest.Mark | None:
        return next(iter(self.iter_markers(name)), None)


def test_a_test_that_shares_the_host_is_in_the_hosts_group_whatever_group_its_module_gives_it() -> None:
    """A module's own group (test_migrate.py's `v1-workspace`) beside `host` made a group of the pair,
    run in another worker beside the `host` group's tests."""
    group = pytest.mark.xdist_group
    both = Marked("t", group("v1-workspace"), group("host"))
    assert group_of(both) == "host"
    assert group_of(Marked("t", group(name="deploy"), group("v1-workspace"))) == "deploy"
    assert group_of(Marked("t", group("b"), group("a"))) == "a_b"
    assert group_of(Marked("t")) is None


def test_the_end_to_end_and_long_tests_are_handed_out_first_each_side_in_its_order() -> None:
    e2e, long = pytest.mark.e2e, pytest.mark.long
    items = [Marked("unit-1"), Marked("e2e-1", e2e), Marked("unit-2"), Marked("long", long), Marked("e2e-2", e2e)]
    assert [item.name for item in long_tests_first(items)] == ["e2e-1", "long", "e2e-2", "unit-1", "unit-2"]
