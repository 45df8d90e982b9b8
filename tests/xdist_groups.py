"""pytest-xdist's `--dist loadgroup`, made to hold on pytest 9, and ordered so that no long test ends
the run alone.

xdist sends the tests of one `xdist_group` to one worker by the suffix `@<group>` it gives their
node ids, which it writes to `item._nodeid`. pytest 9 keeps a node's id in a structured `NodeId`
instead, so that write changes nothing: every group was spread over the workers, and tests that
share the host (the agent's Unix user, its control group, the deploys' venv) ran at the same time.
This plugin gives the ids their suffix where xdist's did not take, after xdist has tried.

A test in a group that shares the host (HOST_SHARING) is in that group alone, whatever other group
its module puts it in: xdist would name the pair a group of its own (`host_v1-workspace`), run
beside the `host` group's tests in another worker.

The end-to-end tests (seconds to a minute each) and those marked `long` come before the unit tests
(mostly milliseconds):
xdist hands the tests out in this order (the groups first, the largest first), so the last tests
every worker runs are short ones, and the workers end together rather than one finishing a long
test alone.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from _pytest.nodeid import NodeId

HOST_SHARING = ("host", "deploy")  # tests/conftest.py's groups of tests that share the host, one at a time


def group_of(item: pytest.Item) -> str | None:
    """The item's group name as xdist spells it (several groups: joined with `_`; one that shares the
    host: that one alone), or None."""
    names = {str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
             for mark in item.iter_markers("xdist_group")}
    if sharing := [name for name in HOST_SHARING if name in names]:
        return sharing[0]
    return "_".join(sorted(names)) or None


def long_tests_first(items: Sequence[pytest.Item]) -> list[pytest.Item]:
    """The end-to-end tests and those marked `long` first, then the rest, each in the order it had."""
    return sorted(items, key=lambda item: not any(item.get_closest_marker(name) for name in ("e2e", "long")))


@pytest.hookimpl(trylast=True)  # after xdist's own renaming, so that a fixed xdist makes this a no-op
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("loadgroup", default=False):  # set in xdist's workers under --dist loadgroup
        return
    items[:] = long_tests_first(items)
    for item in items:
        if (group := group_of(item)) is None or "@" in item.nodeid:
            continue
        # pytest 9's structured node id: there is no public way to rename a node
        item._id = NodeId.parse(f"{item.nodeid}@{group}")  # type: ignore[attr-defined]
