"""How the runtime starts the agent's CLI in its isolation mode (isolation/policy.py): the program the SDK
runs, the environment it adds, the sandbox settings, and the boot prompt's file.

User mode: the SDK runs a launcher (written at each start into `.os/state/`, root only) that
- puts itself in the agent's control group (isolation/cgroups.py: pids, memory, CPU weight), so
  the CLI and everything it starts are held to the limits of isolation/resources.py;
- keeps a SIGKILL for when the server dies (`setpriv --pdeathsig`), so a server killed with -9 takes
  the CLI with it;
- makes a pid namespace (`unshare --pid --fork --kill-child --mount-proc`): when the CLI, its
  init, ends, the kernel kills everything in it, daemons that called setsid too; and its /proc
  shows only its own processes;
- an IPC namespace: SysV shared memory, semaphores and POSIX queues the agent makes go with it;
- and a mount namespace of its own, where /tmp, /var/tmp, /dev/shm, every other world-writable
  folder the agent can reach (/run/lock: world_writable_dirs) and the agent's home are fresh
  tmpfs mounts (nosuid, nodev): nothing the agent leaves there outlives the session (an rc file
  that would run in the next one), nor is anyone else's to run (a set-uid shell), and no other
  user's /tmp/claude-<uid> is in its way; a workspace that lies under /tmp is bound back in;
- caps the agent's processes (RLIMIT_NPROC, `prlimit`) and lowers their priority (`nice`);
- drops to the agent's user (`setpriv --reuid --regid --init-groups --no-new-privs`), asking
  again for the parent-death signal after the switch (the kernel clears it when credentials
  change: set before, it would be lost);
- runs a copy of the bundled CLI that the agent's user can read and run (CLI_CACHE): the
  checkout may sit under a 0700 directory such as /root. Copies no server has used for a day, and
  no process runs, are pruned at start.

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
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import procfs
from ..config import DEFAULT_MAX_PROCESSES
from ..deploy_contract import AGENT_DIR, apply_ownership, atomic_write, ensure_sysctls
from ..fsutil import sweep_temp_files
from ..logs import get_logger
from ..paths import Layout
from .cgroups import AgentGroup
from .policy import NONE_WARNING, AgentUser, Isolation, Mode
from .probe import MODE_FILE, resolve
from .resources import (
    AGENT_NICE,
    default_memory,
    disk_reserve,
    memory_total,
    mount_of,
)

log = get_logger(__name__)

CLI_CACHE = Path("/var/lib/sprite-os/cli")  # root's, 0755: CLI copies the agent's user can run
CLI_KEPT = 86_400.0  # a copy no server has used for this long, and no process runs, is pruned
LAUNCHER = "agent-cli.sh"
PROMPT = "boot-prompt.md"
PRIVATE_TMP = ("/tmp", "/var/tmp", "/dev/shm")  # each a fresh tmpfs in the CLI's mount namespace
NOT_SCANNED = ("/proc", "/sys")  # no files: writing there is the kernel's business, not a place to leave one


@dataclass(frozen=True)
class Resources:
    """The limits asked for (SPRITE_AGENT_MAX_PROCESSES, SPRITE_AGENT_MEMORY_MAX; None: the default)."""

    max_processes: int = DEFAULT_MAX_PROCESSES
    memory_max: int | None = None


def cli_copy(source: Path, cache: Path = CLI_CACHE) -> Path:
    """Where `source`'s copy goes (or is): keyed by its version, size and mtime. Blocking."""
    st = source.stat()
    version_file = source.with_name("claude.version")
    version = version_file.read_text().split()[0] if version_file.is_file() else "unknown"
    return cache / f"{version}-{st.st_size}-{st.st_mtime_ns}" / "claude"


def cached_cli(source: Path, cache: Path = CLI_CACHE) -> Path:
    """A copy of `source` in `cache`, keyed by its version, size and mtime; hard-linked where the
    file system allows (no space taken), copied otherwise; its folder's mtime says when a server
    last wanted it. Blocking; idempotent."""
    st = source.stat()
    target = cli_copy(source, cache)
    if target.is_file() and target.stat().st_size == st.st_size:
        with contextlib.suppress(OSError):
            os.utime(target.parent)
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


def prune_cli_copies(keep: Path, cache: Path = CLI_CACHE, now: float | None = None) -> list[str]:
    """Remove the copies in `cache` other than `keep` that no server has wanted for CLI_KEPT and no
    process runs (an upgrade leaves the old one behind). Returns the folders removed. Blocking."""
    now = time.time() if now is None else now
    running = {procfs.exe(pid) for pid in procfs.pids()}
    removed = []
    for entry in cache.iterdir() if cache.is_dir() else ():
        if entry == keep.parent or not entry.is_dir() or entry.is_symlink():
            continue
        with contextlib.suppress(OSError):
            if now - entry.stat().st_mtime < CLI_KEPT or str(entry / "claude") in running:
                continue
            shutil.rmtree(entry)
            removed.append(entry.name)
    return removed


def world_writable_dirs(skip: Sequence[Path] = (), root: Path = Path("/")) -> list[str]:
    """Every directory anyone may write in (o+w, sticky or not) that any user can reach from `root`
    (each folder above it o+x), not descending into one found, nor into `skip` (the workspace), nor
    /proc and /sys: where the agent could leave a file for others (a set-uid shell in /run/lock).
    Each gets a private tmpfs in the CLI's namespace. Blocking: a walk of the file tree (about 1 s
    for 30,000 folders)."""
    pruned = {str(p) for p in skip} | set(NOT_SCANNED)
    found, stack = [], [str(root)]
    while stack:
        with contextlib.suppress(OSError), os.scandir(stack.pop()) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    if entry.path in pruned or not entry.is_dir(follow_symlinks=False):
                        continue
                    mode = entry.stat(follow_symlinks=False).st_mode
                    if mode & 0o002:
                        found.append(entry.path)
                    elif mode & 0o001:
                        stack.append(entry.path)
    return sorted(found)


def launcher_script(cli: Path, user: AgentUser, *, workspace: Path, cgroups: Sequence[Path] = (),
                    max_processes: int = DEFAULT_MAX_PROCESSES, tmp_bytes: int = 1 << 30,
                    private_tmp: tuple[str, ...] = PRIVATE_TMP) -> str:
    """The script the SDK runs as the CLI (root's, 0700), for `user` (see the module's docstring)."""
    tool = {name: shutil.which(name) or name for name in ("setpriv", "unshare", "mount", "prlimit", "nice")}
    uid, gid, q = user.uid, user.gid, shlex.quote
    tmpfs = f"{q(tool['mount'])} -t tmpfs -o nosuid,nodev,size={tmp_bytes}"
    covered = next((d for d in private_tmp if workspace == Path(d) or Path(d) in workspace.parents), None)
    inner = ["set -e", f"ws={q(str(workspace))}"]
    if covered:  # opened before /tmp is covered, bound back in after: the CLI works there
        inner.append('exec 3<"$ws"')
    inner += [f"{tmpfs},mode=1777 sprite-agent-tmp {q(d)}" for d in private_tmp]
    if covered:
        inner += ['mkdir -p "$ws"', f'{q(tool["mount"])} --no-canonicalize --bind /proc/self/fd/3 "$ws"', "exec 3<&-"]
    inner += [f"{tmpfs},mode=0700,uid={uid},gid={gid} sprite-agent-home {q(str(user.home))}", 'cd "$ws"',
              f"exec {q(tool['prlimit'])} --nproc={max_processes}:{max_processes} --core=0 -- "
              f"{q(tool['nice'])} -n {AGENT_NICE} {q(tool['setpriv'])} --reuid={uid} --regid={gid} --init-groups "
              f'--no-new-privs --pdeathsig KILL -- {q(str(cli))} "$@"']
    outer = [tool["setpriv"], "--pdeathsig", "KILL", "--", tool["unshare"], "--pid", "--ipc", "--fork", "--kill-child=SIGKILL",
             "--mount-proc", "--propagation", "private", "--", "/bin/sh", "-c", "\n".join(inner), "sprite-agent-cli"]
    join = "".join(f"echo $$ > {q(str(p))} || exit 1\n" for p in cgroups)
    return ("#!/bin/sh\n# Written by Sprite OS at start (isolation/launch.py): the agent's CLI, as its own user, in its\n"
            "# own control group, pid and mount namespaces, with a private /tmp and a fresh home.\n"
            f"{join}echo {OOM_SCORE_ADJ} > /proc/self/oom_score_adj\n"
            f'exec {shlex.join(outer)} "$@"\n')


CAP_SYS_RESOURCE = 24
OOM_SCORE_ADJ = 1000  # the agent's processes: the OOM killer's first choice


def oom_floor(status: str) -> dict[str, Any]:
    """Whether the agent can lower its oom_score_adj, from this process's /proc/self/status. Root's
    write in the launcher sets the kernel's floor too (oom_score_adj_min, kept across fork and
    exec; below it only CAP_SYS_RESOURCE may go), but only when root holds CAP_SYS_RESOURCE: a
    container that drops it leaves the floor at the server's own value, and the agent free to lower
    its score to that."""
    effective = next((int(line.split()[1], 16) for line in status.splitlines() if line.startswith("CapEff:")), 0)
    holds = bool(effective >> CAP_SYS_RESOURCE & 1)
    return {"score_adj": OOM_SCORE_ADJ, "floor": holds,
            "why": "set by root with CAP_SYS_RESOURCE: the agent cannot lower it" if holds else
                   "the server lacks CAP_SYS_RESOURCE (dropped by its container): the agent can lower it"}


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
    def __init__(self, layout: Layout, isolation: Isolation | None = None, resources: Resources | None = None) -> None:
        self.layout = layout
        self.isolation = isolation or Isolation("none")  # until prepare() resolves the settings' request
        self.resources = resources or Resources()
        self.prompt_file = layout.os_dir / AGENT_DIR / PROMPT
        self._launcher = layout.state_dir / LAUNCHER
        self._group = AgentGroup()
        self._cli: Path | None = None
        self.limits: dict[str, Any] = _not_limited(self.isolation)

    @property
    def mode(self) -> Mode:
        return self.isolation.mode

    @property
    def group_dirs(self) -> tuple[Path, ...]:
        """The agent's control group, one folder per hierarchy (none without cgroups or user mode)."""
        return tuple(self._group.dirs)

    def resolve(self, requested: str, agent_user: str, decided: Isolation | None = None) -> Isolation:
        """Choose the mode (ConfigError when what was asked can't be had), then prepare(). Blocking.
        `decided`: the mode `sprite-os serve` chose already, before the server's import."""
        self.isolation = isolation = decided or resolve(self.layout, requested, agent_user)
        if isolation.mode == "none":
            log.warning("isolation_none", detail=NONE_WARNING, why=isolation.reason)
        else:
            log.info("isolation", mode=isolation.mode, agent_user=getattr(isolation.agent_user, "name", None),
                     why=isolation.reason)
        self.prepare()
        return isolation

    def prepare(self) -> None:
        """At the server's start, holding the workspace's lock, before any CLI: owners and modes, the
        agent's home, its control group, the launcher; what limits are in force; what a kill left of
        these files' temp copies goes. Blocking."""
        (self.layout.os_dir / AGENT_DIR).mkdir(mode=0o700, exist_ok=True)
        sweep_temp_files(self.layout.state_dir, lambda name: name in (MODE_FILE, LAUNCHER))
        sweep_temp_files(self.prompt_file.parent, lambda name: name == PROMPT)
        user = self.isolation.agent_user
        self.limits = _not_limited(self.isolation)
        if self.mode == "user" and user is not None:
            self._prepare_user(user)
        atomic_write(self.layout.state_dir / MODE_FILE, json.dumps(
            {"mode": self.mode, "reason": self.isolation.reason, "limits": self.limits}).encode(), mode=0o600)

    def _prepare_user(self, user: AgentUser) -> None:
        apply_ownership(self.layout.root, user.uid, user.gid, deep=False)
        if os.path.islink(self.layout.os_dir / "current") and (killed := kill_processes_of(user.uid)):
            # On a Sprite the agent's uid is this server's alone: anything running as it now is a
            # leftover (the pid namespace ends a CLI's processes with it; this is the safety net).
            log.warning("agent_leftovers_killed", uid=user.uid, pids=killed)
        if changed := ensure_sysctls():
            log.warning("sysctls_set", names=changed, detail="the deploy sets them for good")
        user.home.mkdir(parents=True, exist_ok=True)  # the mount point of its fresh tmpfs
        os.chown(user.home, user.uid, user.gid)
        os.chmod(user.home, 0o700)
        self._cli = cli = cached_cli(_bundled_cli())
        if pruned := prune_cli_copies(cli):
            log.info("cli_copies_pruned", removed=pruned)
        res = self.resources
        memory = res.memory_max or default_memory(memory_total(Path("/proc/meminfo").read_text()) or 0) or (1 << 30)
        self._group.remove()  # a second prepare (tests) makes a new one
        self._group = AgentGroup.create(res.max_processes, memory)
        workspace = self.layout.root.resolve()
        tmp = [d for d in PRIVATE_TMP if os.path.isdir(d) and not os.path.islink(d)]
        tmp += [d for d in world_writable_dirs(skip=(workspace, user.home)) if d not in tmp]
        script = launcher_script(cli, user, workspace=workspace, cgroups=self._group.procs_files,
                                 max_processes=res.max_processes, tmp_bytes=memory, private_tmp=tuple(tmp))
        atomic_write(self._launcher, script.encode(), mode=0o700)
        self.limits = self._limits_in_force(user, memory, tmp)
        log.info("agent_limits", **{k: v.get("by") if isinstance(v, dict) else v for k, v in self.limits.items()})

    def _limits_in_force(self, user: AgentUser, memory: int, tmp: list[str]) -> dict[str, Any]:
        group = self._group.in_force
        st = os.statvfs(self.layout.root)
        mount = mount_of(self.layout.root.resolve(), Path("/proc/self/mountinfo").read_text())
        disk = disk_reserve(mount, st.f_frsize, st.f_bfree, st.f_bavail, os.geteuid() == 0, user.uid, user.gid)
        if not disk.holds:
            log.warning("disk_not_reserved", detail=disk.why)
        processes = self.resources.max_processes
        return {
            "processes": {"max": processes, "by": [*([group["pids"]] if "pids" in group else []),
                                                   f"RLIMIT_NPROC={processes}"]},
            "memory": {"max_bytes": memory if "memory" in group else None, "by": [group[k] for k in ("memory",) if k in group]},
            "cpu": {"by": [*([group["cpu"]] if "cpu" in group else []), f"nice {AGENT_NICE}"]},
            "disk": {"reserved_bytes": disk.reserved_bytes, "holds": disk.holds, "why": disk.why},
            "tmp": {"private": tmp, "options": "tmpfs nosuid,nodev, fresh each session", "max_bytes": memory},
            "home": {"path": str(user.home), "fresh": "a tmpfs each session: nothing in it outlives the session"},
            "oom": oom_floor(Path("/proc/self/status").read_text()),
        }

    def close(self) -> None:
        """The server is stopping, its CLI closed: remove the agent's control group. Blocking."""
        self._group.remove()

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
        """Write the boot prompt for the next CLI; returns the SDK's system_prompt for it. Blocking.
        In user mode it also makes sure the CLI's copy is still there (another server may have
        pruned it, or someone removed it): the launcher names it."""
        user = self.isolation.agent_user
        if self._cli is not None and not self._cli.is_file():
            self._cli = cached_cli(_bundled_cli())
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


def _bundled_cli() -> Path:
    """The SDK's CLI. The SDK is imported by whoever starts a CLI, not by all who import this."""
    from ..agent.process import bundled_cli

    return bundled_cli()


def _not_limited(isolation: Isolation) -> dict[str, Any]:
    return {"in_force": False, "why": f"the agent's resource limits hold in user isolation only; this is "
                                      f"{isolation.mode} ({isolation.reason or 'not yet chosen'})"}
