"""Where a world's workspace lives. Most scenarios share one workspace (on a small tmpfs when
the suite runs as root); those whose fault is the disk itself, or the way a Sprite is
deployed, get a fresh one of their own:

- `lazy`: devkit/lazyfs.py, which drops every unsynced write when the power goes;
- `slow_disk`: the same file system, each fsync held `Plan.slow_fsync` seconds;
- `ext4`: an ext4 image on a loop device, mounted `errors=remount-ro`, whose next error the
  scenario forces;
- `deployed`: a workspace marked as deployed (`.os/current`), the agent as its own user.

Each needs root (and FUSE or a loop device); elsewhere `FaultSetupFailed` says why, and the
runner reports the scenario as skipped with that reason."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devkit.faults import FaultSetupFailed, lazy_disk, loop_ext4

EXT4_SIZE = "256M"
TEST_AGENT_USER = "SPRITE_TEST_AGENT_USER"  # as the test suite: engineers sharing a machine use their own


@dataclass
class Place:
    workspace: Path
    disk: Any = None  # LazyDisk or LoopExt4: what the scenario acts on
    env: dict[str, str] = field(default_factory=dict)  # the server's environment there


@contextlib.contextmanager
def deployed(root: Path) -> Iterator[Place]:
    """A workspace a deployed Sprite would have (`.os/current`, so the server refuses to run its
    agent without isolation), in a folder the agent's user can reach, and that user (created if
    missing, removed afterwards if this made it)."""
    if os.geteuid() != 0:
        raise FaultSetupFailed("needs root: on a deployed Sprite the agent runs as its own user")
    from sprite_os.deploy_contract import ensure_agent_user
    from sprite_os.isolation.probe import agent_user

    name = os.environ.get(TEST_AGENT_USER, "sprite-agent")
    existed = agent_user(name) is not None
    ensure_agent_user(name)
    base = Path(tempfile.mkdtemp(prefix="sprite-chaos-deployed-", dir="/tmp"))  # root's tmp dirs are 0700
    os.chmod(base, 0o755)
    workspace = base / "workspace"
    (workspace / ".os").mkdir(parents=True)
    os.symlink("releases/chaos", workspace / ".os" / "current")  # what bootstrap/deploy.py makes
    try:
        yield Place(workspace, env={"SPRITE_ISOLATION": "user", "SPRITE_AGENT_USER": name})
    finally:
        shutil.rmtree(base, ignore_errors=True)
        if not existed:
            subprocess.run(["userdel", "-r", name], check=False, capture_output=True)


@contextlib.contextmanager
def place(kind: str, root: Path, slow_fsync: float) -> Iterator[Place]:
    root.mkdir(parents=True, exist_ok=True)
    if kind in ("lazy", "slow_disk"):
        with lazy_disk(root, slow_fsync if kind == "slow_disk" else 0.0) as disk:
            yield Place(disk.mount / "workspace", disk)
    elif kind == "ext4":
        with loop_ext4(root, EXT4_SIZE) as ext4:
            yield Place(ext4.mount / "workspace", ext4)
    elif kind == "deployed":
        with deployed(root) as found:
            yield found
    else:
        raise ValueError(f"no such place: {kind}")
