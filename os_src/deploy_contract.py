"""What bootstrap/deploy.py takes from the release it installs: the memory files (names, owners,
limits), the user-space folders, the token rule and the atomic write. Defined here once; the
product imports them from here (paths.py, config.py, fsutil.py, memory/files.py).

STANDARD LIBRARY ONLY, and no import from this package: deploy.py runs with the system python3
before any venv exists and loads this file by its path from the release it deploys, outside any
package (tests/test_deploy.py holds it to that).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal


@dataclass(frozen=True)
class FileSpec:
    name: str
    owner: Literal["deploy", "daemon"]  # deploy: rewritten by every deploy; daemon: created once, then curated
    max_lines: int
    title: str  # how the boot prompt introduces it
    empty: str  # what the prompt shows when the file is missing or empty


# In boot order. Each has a template, bootstrap/templates/<name>, that deploys install.
MEMORY_FILES: dict[str, FileSpec] = {
    spec.name: spec
    for spec in (
        FileSpec("soul.md", "deploy", 200, "Who you are", "You are a helpful, careful assistant."),
        FileSpec("os.md", "deploy", 200, "How this system works", "No system rules were deployed."),
        FileSpec("tools.md", "daemon", 150, "What you have learned to do", "Nothing recorded yet."),
        FileSpec("files.md", "daemon", 200, "What is in the user's files", "Nothing recorded yet."),
        FileSpec("user.md", "daemon", 200, "Who you are working with", "Nothing recorded yet."),
        FileSpec("context.md", "daemon", 200, "What is going on now", "Nothing recorded yet."),
    )
}

# The user's folders at the workspace root, beside `.os/`.
USER_SPACE_DIRS = ("documents", "ocr", "extractions", "artifacts")

MIN_TOKEN_LENGTH = 16


def token_problem(token: str) -> str | None:
    """Why `token` cannot be the bearer token ("must be ..."), or None if it can."""
    if len(token) < MIN_TOKEN_LENGTH:
        return f"must be at least {MIN_TOKEN_LENGTH} characters"
    if not (token.isascii() and token.isprintable()) or " " in token:
        return "must be printable ASCII without spaces"
    return None


def atomic_write(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Write to a temp file beside `path`, fsync it, rename it over `path`, fsync the directory:
    a reader sees the old content or the new, never a torn file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
