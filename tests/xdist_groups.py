"""pytest-xdist's `--dist loadgroup`, made to hold on pytest 9.

xdist sends the tests of one `xdist_group` to one worker by the suffix `@<group>` it gives their
node ids, which it writes to `item._nodeid`. pytest 9 keeps a node's id in a structured `NodeId`
instead, so that write changes nothing: every group was spread over the workers, and tests that
share the host (the agent's Unix user, its control group, the deploys' venv) ran at the same time.
This plugin gives the ids their suffix where xdist's did not take, after xdist has tried.
"""

from __future__ import annotations

import pytest
from _pytest.nodeid import NodeId


def group_of(item: pytest.Item) -> str | None:
    """The item's group name as xdist spells it (several groups: joined with `_`), or None."""
    names = {str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
             for mark in item.iter_markers("xdist_group")}
    return "_".join(sorted(names)) or None


@pytest.hookimpl(trylast=True)  # after xdist's own renaming, so that a fixed xdist makes this a no-op
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("loadgroup", default=False):  # set in xdist's workers under --dist loadgroup
        return
    for item in items:
        if (group := group_of(item)) is None or "@" in item.nodeid:
            continue
        # pytest 9's structured node id: there is no public way to rename a node
        item._id = NodeId.parse(f"{item.nodeid}@{group}")  # type: ignore[attr-defined]
