"""How the agent's CLI is kept out of `.os/`: the mode, chosen from what was asked and what the
machine allows. Pure: the facts come from isolation/probe.py, which does the I/O.

- `user`: the CLI, and everything it runs, runs as a dedicated unprivileged user (SPRITE_AGENT_USER,
  default `sprite-agent`), in a pid namespace of its own; the kernel's permissions keep it out of
  `.os/` (owners and modes: deploy_contract.apply_ownership). Needs root and that user.
- `sandbox`: the CLI's own sandbox (bubblewrap on Linux) denies its commands writes into `.os/`.
  For a developer's machine where the server is not root.
- `none`: nothing but the Write/Edit check in agent/guard.py. Development only, said loudly; a deployed
  Sprite refuses to start with it.

`auto` (the default) takes the first of user, sandbox, none the machine allows.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..config import REQUESTS
from ..errors import ConfigError

Mode = Literal["user", "sandbox", "none"]


@dataclass(frozen=True)
class AgentUser:
    name: str
    uid: int
    gid: int
    home: Path


@dataclass(frozen=True)
class Facts:
    """What the machine allows, as isolation_probe.probe found it."""

    root: bool  # the server runs as root (it may switch users)
    agent_user: AgentUser | None  # the agent's user, if it exists
    switch_tools: str | None  # None when setpriv and unshare are there; else what is missing
    sandbox_problem: str | None  # None when the CLI's sandbox can work; else why not
    deployed: bool  # the workspace was deployed (bootstrap/deploy.py made `.os/current`)
    unreachable: str | None = None  # a directory above the workspace the agent's user can't pass through


@dataclass(frozen=True)
class Isolation:
    mode: Mode
    agent_user: AgentUser | None = None  # set in user mode
    note: str = ""  # why this mode, when it is not what was asked (for the start's log)


NONE_WARNING = ("the agent runs with no isolation: its commands can change .os/ (memory, code, settings) "
                "and read the token. Development only; set SPRITE_ISOLATION=user (as root) or sandbox")


def _user_problem(facts: Facts, user: str) -> str | None:
    if not facts.root:
        return "the server is not root, so it cannot run the agent as another user"
    if facts.agent_user is None:
        return f"the agent's user {user!r} does not exist (bootstrap/deploy.py creates it; or useradd --system)"
    if facts.agent_user.uid == 0:
        return f"the agent's user {user!r} is root"
    if facts.unreachable:
        return f"the agent's user {user!r} can't reach the workspace: {facts.unreachable} is closed to it"
    return facts.switch_tools


def choose(requested: str, user: str, facts: Facts) -> Isolation:
    """The mode the agent runs in. ConfigError (exit 2) when what was asked can't be had, or when
    a deployed Sprite would run the agent with no isolation."""
    if requested not in REQUESTS:
        raise ConfigError(f"SPRITE_ISOLATION must be one of {', '.join(REQUESTS)}, got {requested!r}")
    user_problem = _user_problem(facts, user)
    if requested == "user":
        if user_problem:
            raise ConfigError(f"SPRITE_ISOLATION=user: {user_problem}")
        return Isolation("user", facts.agent_user)
    if requested == "sandbox":
        if facts.sandbox_problem:
            raise ConfigError(f"SPRITE_ISOLATION=sandbox: {facts.sandbox_problem}")
        return Isolation("sandbox")
    if requested == "auto":
        if user_problem is None:
            return Isolation("user", facts.agent_user)
        if facts.sandbox_problem is None:
            return Isolation("sandbox", note=f"not user: {user_problem}")
    if facts.deployed:
        why = ("SPRITE_ISOLATION=none" if requested == "none"
               else f"no isolation is possible (user: {user_problem}; sandbox: {facts.sandbox_problem})")
        raise ConfigError(f"a deployed Sprite never runs its agent without isolation: {why}")
    note = "" if requested == "none" else f"not user: {user_problem}; not sandbox: {facts.sandbox_problem}"
    return Isolation("none", note=note)
