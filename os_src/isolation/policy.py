"""How the agent's CLI is kept out of `.os/`: the mode, chosen from what was asked and what the
machine allows. Pure: the facts come from isolation/probe.py, which does the I/O.

- `user`: the CLI, and everything it runs, runs as a dedicated unprivileged user (SPRITE_AGENT_USER,
  default `sprite-agent`), in a pid namespace of its own; the kernel's permissions keep it out of
  `.os/` (owners and modes: deploy_contract.apply_ownership). Needs root and that user.
- `sandbox`: the CLI's own sandbox (bubblewrap on Linux) denies its commands writes into `.os/`.
  For a developer's machine where the server is not root.
- `none`: nothing but the Write/Edit check in agent/guard.py. Development only, said loudly; a deployed
  Sprite refuses to start with it.

`auto` (the default) takes the first of user, sandbox, none the machine allows, except on a
deployed Sprite: there it is `user` or no start at all, unless the operator names a weaker mode
(SPRITE_ISOLATION=sandbox; `none` never). The agent's user must be the one Sprite OS made for it
(marked so, deploy_contract.AGENT_MARK), never a service's or a person's: a start kills every
process of that user, and the agent would get its files and groups. Every choice carries its reason,
for the start's log, /healthz and dev mode's banner.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..config import REQUESTS
from ..deploy_contract import AGENT_MARK
from ..errors import ConfigError

Mode = Literal["user", "sandbox", "none"]


@dataclass(frozen=True)
class AgentUser:
    name: str
    uid: int
    gid: int
    home: Path
    marked: bool = True  # made by Sprite OS for its agent (deploy_contract.ensure_agent_user)


@dataclass(frozen=True)
class Facts:
    """What the machine allows, as isolation/probe.py's probe found it."""

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
    reason: str = ""  # why this mode (the start's log, /healthz, dev mode's banner)


NONE_WARNING = ("the agent runs with no isolation: its commands can change .os/ (memory, code, settings) "
                "and read the token. Development only; set SPRITE_ISOLATION=user (as root) or sandbox")


def _user_problem(facts: Facts, user: str) -> str | None:
    if not facts.root:
        return "the server is not root, so it cannot run the agent as another user"
    if facts.agent_user is None:
        return f"the agent's user {user!r} does not exist (bootstrap/deploy.py creates it; or useradd --system)"
    if facts.agent_user.uid == 0:
        return f"the agent's user {user!r} is root"
    if not facts.agent_user.marked:
        return (f"the user {user!r} was not made for the agent (its comment is not {AGENT_MARK!r}): it may be a "
                "service's or a person's, whose processes every start would kill; name the agent's own user in "
                "SPRITE_AGENT_USER, which the deploy creates")
    if facts.unreachable:
        return f"the agent's user {user!r} can't reach the workspace: {facts.unreachable} is closed to it"
    return facts.switch_tools


def choose(requested: str, user: str, facts: Facts) -> Isolation:
    """The mode the agent runs in, and why. ConfigError (exit 2) when what was asked can't be had,
    or when a deployed Sprite would run its agent weaker than as its own user without being told to."""
    if requested not in REQUESTS:
        raise ConfigError(f"SPRITE_ISOLATION must be one of {', '.join(REQUESTS)}, got {requested!r}")
    user_problem = _user_problem(facts, user)
    if requested == "user":
        if user_problem:
            raise ConfigError(f"SPRITE_ISOLATION=user: {user_problem}")
        return Isolation("user", facts.agent_user, f"SPRITE_ISOLATION=user, as {user}")
    if requested == "sandbox":
        if facts.sandbox_problem:
            raise ConfigError(f"SPRITE_ISOLATION=sandbox: {facts.sandbox_problem}")
        return Isolation("sandbox", reason="SPRITE_ISOLATION=sandbox" + (" (weaker than user, as the operator "
                                                                         "named)" if facts.deployed else ""))
    if requested == "auto":
        if user_problem is None:
            return Isolation("user", facts.agent_user, f"auto: the server is root and {user} is the agent's own user")
        if facts.deployed:
            raise ConfigError(f"a deployed Sprite runs its agent as its own user, and cannot: {user_problem}. "
                              "SPRITE_ISOLATION=sandbox runs it in the CLI's sandbox instead, if you mean to")
        if facts.sandbox_problem is None:
            return Isolation("sandbox", reason=f"auto: not user, as {user_problem}")
    if facts.deployed:  # auto was refused above
        raise ConfigError("a deployed Sprite never runs its agent without isolation: SPRITE_ISOLATION=none")
    if requested == "none":
        return Isolation("none", reason="SPRITE_ISOLATION=none")
    return Isolation("none", reason=f"auto: not user, as {user_problem}; not sandbox, as {facts.sandbox_problem}")
