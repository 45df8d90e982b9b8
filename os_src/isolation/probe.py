"""The I/O behind isolation/policy.py: which isolation this machine allows, found once at start."""

from __future__ import annotations

import grp
import json
import os
import pwd
import shutil
import subprocess
import sys
from pathlib import Path

from ..deploy_contract import is_agent_user
from ..paths import Layout
from .policy import AgentUser, Facts, Isolation, choose

SANDBOX_TOOLS = ("bwrap", "socat")  # what the CLI's sandbox runs on Linux (bubblewrap, its network proxy)
# util-linux: the user switch, the pid and mount namespaces, the private mounts, the rlimits (isolation/launch.py)
SWITCH_TOOLS = ("setpriv", "unshare", "mount", "prlimit")
MODE_FILE = "isolation.json"  # in .os/state: the mode the server chose at its start (memory status reads it)


def agent_user(name: str) -> AgentUser | None:
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return None
    return AgentUser(entry.pw_name, entry.pw_uid, entry.pw_gid, Path(entry.pw_dir), is_agent_user(entry.pw_gecos))


def unreachable(workspace: Path, user: AgentUser | None) -> str | None:
    """The first directory above `workspace` that `user` may not pass through (no x for it), or None."""
    if user is None:
        return None
    groups = {user.gid, *(g.gr_gid for g in grp.getgrall() if user.name in g.gr_mem)}
    for directory in reversed(workspace.resolve().parents):
        try:
            st = directory.stat()
        except OSError:
            return None  # not made yet: whoever makes it decides
        bit = 0o100 if st.st_uid == user.uid else 0o010 if st.st_gid in groups else 0o001
        if not st.st_mode & bit:
            return f"{directory} (mode {st.st_mode & 0o7777:o})"
    return None


def _missing(tools: tuple[str, ...]) -> list[str]:
    return [tool for tool in tools if shutil.which(tool) is None]


def sandbox_problem() -> str | None:
    """Why the CLI's sandbox can't work here, or None. On Linux it needs bubblewrap able to make
    namespaces (a container may forbid them) and socat."""
    if sys.platform == "darwin":
        return None  # the CLI uses the system's sandbox-exec
    if not sys.platform.startswith("linux"):
        return f"the CLI has no sandbox on {sys.platform}"
    if missing := _missing(SANDBOX_TOOLS):
        return f"{' and '.join(missing)} not installed (Debian: apt-get install bubblewrap socat)"
    try:
        run = subprocess.run(["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--unshare-pid", "true"],
                             capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap does not run: {exc}"
    if run.returncode != 0:
        return f"bubblewrap cannot make its namespaces here: {run.stderr.decode(errors='replace').strip()[:200]}"
    return None


def probe(layout: Layout, user: str) -> Facts:
    """Blocking (it may run bubblewrap once): call it before the event loop, or off it."""
    missing = _missing(SWITCH_TOOLS)
    found = agent_user(user)
    return Facts(
        root=os.geteuid() == 0,
        agent_user=found,
        switch_tools=f"{' and '.join(missing)} not installed (util-linux)" if missing else None,
        sandbox_problem=sandbox_problem(),
        deployed=os.path.islink(layout.os_dir / "current"),
        unreachable=unreachable(layout.root, found),
    )


def resolve(layout: Layout, requested: str, user: str) -> Isolation:
    return choose(requested, user, probe(layout, user))


def read_mode(layout: Layout) -> dict[str, str] | None:
    """The isolation the server chose at its last start (for `sprite-os memory status`)."""
    try:
        data = json.loads((layout.state_dir / MODE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
