"""How the runtime starts the agent's CLI in its isolation mode (isolation/policy.py): the program the SDK
runs, the environment it adds, the sandbox settings, and the boot prompt's file.

User mode: the SDK runs a launcher (written at each start into `.os/state/`, root only) that
- keeps a SIGKILL for when the server dies (`setpriv --pdeathsig`), so a server killed with -9 takes
  the CLI with it;
- makes a pid namespace (`unshare --pid --fork --kill-child --mount-proc`): when the CLI, its
  init, ends, the kernel kills everything in it, daemons that called setsid too; and its /proc
  shows only its own processes;
- drops to the agent's user (`setpriv --reuid --regid --init-groups --no-new-privs`), asking
  again for the parent-death signal after the switch (the kernel clears it when credentials
  change: set before, it would be lost);
- runs a copy of the bundled CLI that the agent's user can read and run (CLI_CACHE): the
  checkout may sit under a 0700 directory such as /root.

The boot prompt goes to the CLI as a file (`--system-prompt-file`), not as one argument (Linux
caps one at 128 KiB; a NUL byte fails the start): `.os/agent/boot-prompt.md`, root's, 0640 group
the agent's (user mode), written before each connect and removed when the CLI is closed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
from pathlib import Path

from .. import procfs
from ..agent.process import bundled_cli
from ..deploy_contract import AGENT_DIR, apply_ownership, atomic_write, ensure_sysctls
from ..fsutil import sweep_temp_files
from ..logs import get_logger
from ..paths import Layout
from .policy import NONE_WARNING, Isolation, Mode
from .probe import MODE_FILE, resolve

log = get_logger(__name__)

CLI_CACHE = Path("/var/lib/sprite-os/cli")  # root's, 0755: CLI copies the agent's user can run
LAUNCHER = "agent-cli.sh"
PROMPT = "boot-prompt.md"


def cached_cli(source: Path, cache: Path = CLI_CACHE) -> Path:
    """A copy of `source` in `cache`, keyed by its version, size and mtime; hard-linked where the
    file system allows (no space taken), copied otherwise. Blocking; idempotent."""
    st = source.stat()
    version_file = source.with_name("claude.version")
    version = version_file.read_text().split()[0] if version_file.is_file() else "unknown"
    target = cache / f"{version}-{st.st_size}-{st.st_mtime_ns}" / "claude"
    if target.is_file() and target.stat().st_size == st.st_size:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    for directory in (cache.parent, cache, target.parent):
        if directory.stat().st_uid == os.geteuid():
            os.chmod(directory, 0o755)
    tmp = target.with_name(f".claude.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    try:
        os.link(source, tmp)
    except OSError:
        shutil.copy2(source, tmp)
    os.chmod(tmp, 0o755)
    os.replace(tmp, target)
    return target


def launcher_script(cli: Path, uid: int, gid: int) -> str:
    setpriv, unshare = (shutil.which(tool) or tool for tool in ("setpriv", "unshare"))
    inner = [setpriv, f"--reuid={uid}", f"--regid={gid}", "--init-groups", "--no-new-privs",
             "--pdeathsig", "KILL", "--", str(cli)]
    outer = [setpriv, "--pdeathsig", "KILL", "--", unshare, "--pid", "--fork", "--kill-child=SIGKILL",
             "--mount-proc", "--", *inner]
    return ("#!/bin/sh\n# Written by Sprite OS at start (isolation/launch.py): the agent's CLI, as its own user.\n"
            f"exec {shlex.join(outer)} \"$@\"\n")


def kill_processes_of(uid: int) -> list[int]:
    """SIGKILL every process whose real uid is `uid`. Blocking."""
    killed = []
    for pid in procfs.pids():
        if procfs.uid(pid) != uid:
            continue
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:  # gone meanwhile
            continue
        killed.append(pid)
    return killed


class AgentLaunch:
    def __init__(self, layout: Layout, isolation: Isolation | None = None) -> None:
        self.layout = layout
        self.isolation = isolation or Isolation("none")  # until prepare() resolves the settings' request
        self.prompt_file = layout.os_dir / AGENT_DIR / PROMPT
        self._launcher = layout.state_dir / LAUNCHER

    @property
    def mode(self) -> Mode:
        return self.isolation.mode

    def resolve(self, requested: str, agent_user: str) -> Isolation:
        """Choose the mode (ConfigError when what was asked can't be had), then prepare(). Blocking."""
        self.isolation = isolation = resolve(self.layout, requested, agent_user)
        if isolation.mode == "none":
            log.warning("isolation_none", detail=NONE_WARNING, why=isolation.note or "SPRITE_ISOLATION=none")
        else:
            log.info("isolation", mode=isolation.mode, agent_user=getattr(isolation.agent_user, "name", None),
                     note=isolation.note or None)
        self.prepare()
        return isolation

    def prepare(self) -> None:
        """At the server's start, holding the workspace's lock, before any CLI: owners and modes, the
        launcher, the agent's home; what a kill left of these files' temp copies goes. Blocking."""
        (self.layout.os_dir / AGENT_DIR).mkdir(mode=0o700, exist_ok=True)
        sweep_temp_files(self.layout.state_dir, lambda name: name in (MODE_FILE, LAUNCHER))
        sweep_temp_files(self.prompt_file.parent, lambda name: name == PROMPT)
        atomic_write(self.layout.state_dir / MODE_FILE,
                     json.dumps({"mode": self.mode, "note": self.isolation.note}).encode(), mode=0o600)
        user = self.isolation.agent_user
        if self.mode != "user" or user is None:
            return
        apply_ownership(self.layout.root, user.uid, user.gid, deep=False)
        if os.path.islink(self.layout.os_dir / "current") and (killed := kill_processes_of(user.uid)):
            # On a Sprite the agent's uid is this server's alone: anything running as it now is a
            # leftover (the pid namespace ends a CLI's processes with it; this is the safety net).
            log.warning("agent_leftovers_killed", uid=user.uid, pids=killed)
        if changed := ensure_sysctls():
            log.warning("sysctls_set", names=changed, detail="the deploy sets them for good")
        user.home.mkdir(parents=True, exist_ok=True)
        os.chown(user.home, user.uid, user.gid)
        os.chmod(user.home, 0o700)
        cli = cached_cli(bundled_cli())
        atomic_write(self._launcher, launcher_script(cli, user.uid, user.gid).encode(), mode=0o700)

    def cli_path(self) -> str | None:
        """What the SDK runs: the launcher in user mode, else the SDK's own choice."""
        return str(self._launcher) if self.mode == "user" else None

    def env(self) -> dict[str, str]:
        """What the CLI's environment adds in this mode: in user mode, the agent's own home."""
        user = self.isolation.agent_user
        if self.mode != "user" or user is None:
            return {}
        home = str(user.home)
        return {"HOME": home, "USER": user.name, "LOGNAME": user.name, "CLAUDE_CONFIG_DIR": f"{home}/.claude",
                "XDG_RUNTIME_DIR": "", "XDG_CONFIG_HOME": "", "XDG_CACHE_HOME": "", "XDG_DATA_HOME": "",
                "XDG_STATE_HOME": ""}

    def settings(self) -> str | None:
        """The CLI's --settings in sandbox mode: every Bash command in bubblewrap, none outside it,
        `.os/` not writable, the secrets and logs not readable; no start without the sandbox.
        Memory stays readable here: bubblewrap hides a denied folder behind a writable tmpfs, where
        a write into memory would seem to work, and the model would believe it had saved something."""
        if self.mode != "sandbox":
            return None
        layout = self.layout
        sandbox = {
            "enabled": True,
            "autoAllowBashIfSandboxed": True,
            "allowUnsandboxedCommands": False,
            "failIfUnavailable": True,
            "filesystem": {
                "denyWrite": [str(layout.os_dir.resolve())],
                "denyRead": [str(p.resolve()) for p in (layout.token_file, layout.service_env, layout.logs_dir)],
            },
        }
        return json.dumps({"sandbox": sandbox})

    def write_prompt(self, text: str) -> dict[str, str]:
        """Write the boot prompt for the next CLI; returns the SDK's system_prompt for it. Blocking."""
        user = self.isolation.agent_user
        mode = 0o640 if self.mode == "user" else 0o600
        atomic_write(self.prompt_file, text.encode("utf-8", "replace"), mode=mode)
        if self.mode == "user" and user is not None:
            os.chown(self.prompt_file, 0, user.gid)
        return {"type": "file", "path": str(self.prompt_file)}

    def discard_prompt(self) -> None:
        """The CLI that read it is closed. Blocking. A file that can't be removed (a read-only disk)
        is only logged: the next connect rewrites it, or fails for the same reason, and says so."""
        try:
            self.prompt_file.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("boot_prompt_not_removed", path=str(self.prompt_file), error=exc.strerror or repr(exc))
