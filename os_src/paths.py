"""Where everything lives in a workspace: `.os/` for the system, the rest for the user.

The names the deploy shares (`.os` and its folders, the token, the pid file) and `.os`'s modes are
deploy_contract.Workspace's; the server's own files are added here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .deploy_contract import Workspace, make_user_space


@dataclass(frozen=True)
class Layout(Workspace):
    """Paths of one workspace (default `/workspace`)."""

    @property
    def history_dir(self) -> Path:
        """Every previous version of each curated file."""
        return self.memory_dir / ".history"

    @property
    def transcript_db(self) -> Path:
        return self.memory_dir / "transcript.db"

    @property
    def memory_db(self) -> Path:
        return self.memory_dir / "memory.db"

    @property
    def canvas_file(self) -> Path:
        return self.state_dir / "canvas.json"

    @property
    def memory_lock(self) -> Path:
        """Held by the one process that may write the workspace: a server from before its first change
        (the lock comes first), or `memory rebuild`, `memory import`, `migrate-v1`."""
        return self.memory_dir / ".writer.lock"

    @property
    def pid_lock(self) -> Path:
        """Held by `sprite-os service` to write the pid file, and to check and remove it."""
        return self.state_dir / "server.pid.lock"

    @property
    def start_lock(self) -> Path:
        """Held by a `sprite-os service start` from its look at the pid file until its server answers or is
        stopped: one start at a time."""
        return self.state_dir / "server.pid.start-lock"

    def ensure(self) -> None:
        """Create the directories the server needs, with their modes; idempotent."""
        self.make_os_dir()
        self.history_dir.mkdir(exist_ok=True)
        make_user_space(self.root)

    def is_system_path(self, path: str | os.PathLike[str], cwd: Path | None = None) -> bool:
        """True if `path` (relative to `cwd`, symlinks resolved) lies inside `.os/`."""
        candidate = Path(path).expanduser()
        if not candidate.is_absolute():
            candidate = (cwd or self.root) / candidate
        resolved = Path(os.path.realpath(candidate))
        system = Path(os.path.realpath(self.os_dir))
        return resolved == system or system in resolved.parents
