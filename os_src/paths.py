"""Where everything lives in a workspace: `.os/` for the system, the rest for the user."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

from .deploy_contract import PRIVATE_DIRS, USER_SPACE_DIRS, make_user_space


@dataclass(frozen=True)
class Layout:
    """Paths of one workspace (default `/workspace`)."""

    root: Path

    @property
    def os_dir(self) -> Path:
        return self.root / ".os"

    @property
    def memory_dir(self) -> Path:
        return self.os_dir / "memory"

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
    def state_dir(self) -> Path:
        """Runtime state that is neither memory nor code: canvas, pid file, lock."""
        return self.os_dir / "state"

    @property
    def canvas_file(self) -> Path:
        return self.state_dir / "canvas.json"

    @property
    def token_file(self) -> Path:
        return self.os_dir / "token"

    @property
    def service_env(self) -> Path:
        """The settings `sprite-os service` saved (they include secrets)."""
        return self.state_dir / "service.env"

    @property
    def logs_dir(self) -> Path:
        return self.os_dir / "logs"

    @property
    def pid_file(self) -> Path:
        return self.state_dir / "server.pid"

    @property
    def memory_lock(self) -> Path:
        """Held by the one process that may write memory (the server, or `memory rebuild`)."""
        return self.memory_dir / ".writer.lock"

    def user_dirs(self) -> list[Path]:
        return [self.root / name for name in USER_SPACE_DIRS]

    def ensure(self) -> None:
        """Create the directories the server needs; idempotent."""
        for path in (self.os_dir, self.memory_dir, self.history_dir, self.state_dir, self.logs_dir):
            path.mkdir(parents=True, exist_ok=True)
        # .os/ may be passed through (the agent's user reads its boot prompt in .os/agent/, see
        # deploy_contract.apply_ownership), never listed; what it keeps is Sprite OS's alone.
        os.chmod(self.os_dir, 0o711)
        for name in PRIVATE_DIRS:
            with contextlib.suppress(FileNotFoundError):
                os.chmod(self.os_dir / name, 0o700)
        make_user_space(self.root)

    def is_system_path(self, path: str | os.PathLike[str], cwd: Path | None = None) -> bool:
        """True if `path` (relative to `cwd`, symlinks resolved) lies inside `.os/`."""
        candidate = Path(path).expanduser()
        if not candidate.is_absolute():
            candidate = (cwd or self.root) / candidate
        resolved = Path(os.path.realpath(candidate))
        system = Path(os.path.realpath(self.os_dir))
        return resolved == system or system in resolved.parents
