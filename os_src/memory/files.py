"""The six memory files: their owners and limits, crash-safe rewrites, and every past version.

soul.md and os.md are written by deploys; tools.md, files.md, user.md and
context.md by the memory daemon, never by the agent. Each rewrite is atomic and
first preserves the version it replaces under `.os/memory/.history/<file>/`, so
any rewrite can be rolled back, including a person's edit the daemon found on disk.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..deploy_contract import MEMORY_FILES, FileSpec
from ..errors import ConfigError, FileChanged
from ..fsutil import NotDurable, atomic_write, held, make_dirs
from ..paths import Layout
from ..text import safe_text

MAX_FILE_BYTES = 24_000  # a cap beside the line limit, so one very long line can't flood the prompt


SPECS: dict[str, FileSpec] = MEMORY_FILES  # names, owners, limits: shared with bootstrap/deploy.py
BOOT_ORDER = tuple(SPECS)
CURATED = tuple(name for name, spec in SPECS.items() if spec.owner == "daemon")


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def line_count(text: str) -> int:
    return text.count("\n") + (0 if text.endswith("\n") or not text else 1)


def limit_error(name: str, text: str) -> str | None:
    """Why `text` may not become `name`, or None if it fits."""
    spec = SPECS[name]
    lines = line_count(text)
    if lines > spec.max_lines:
        return f"{name} would have {lines} lines; its limit is {spec.max_lines}"
    size = len(text.encode())
    if size > MAX_FILE_BYTES:
        return f"{name} would be {size} bytes; its limit is {MAX_FILE_BYTES}"
    return None


@dataclass(frozen=True)
class Version:
    number: int
    created_at: float
    source: str
    path: Path

    @property
    def text(self) -> str:
        return self.path.read_text(encoding="utf-8")


VERSION_NAME = re.compile(r"^(\d{6})_(\d+)_([a-z0-9-]+)\.md$")


class MemoryFiles:
    def __init__(self, layout: Layout) -> None:
        self.dir = layout.memory_dir
        self.history_dir = layout.history_dir

    def path(self, name: str) -> Path:
        if name not in SPECS:
            raise KeyError(f"unknown memory file {name!r}; the files are {', '.join(SPECS)}")
        return self.dir / name

    def read(self, name: str) -> str:
        """The file's text; missing or unreadable reads as empty (the caller decides the default)."""
        try:
            return self.path(name).read_text(encoding="utf-8", errors="replace")
        except (FileNotFoundError, IsADirectoryError, PermissionError):
            return ""

    def read_all(self) -> dict[str, str]:
        return {name: self.read(name) for name in BOOT_ORDER}

    def write(self, name: str, text: str, source: str, expect: str | None = None) -> Version:
        """Atomically replace `name`, keeping the version it replaces and the new one.

        Whoever wrote `text` (the curator, a person at the console, a rollback), it is stored as
        plain text (text.safe_text: no NUL or other control character but tab and newline).
        Raises ValueError if `text` breaks the file's limits: nothing over a limit is written.
        With `expect` (a sha256), raises FileChanged unless the file still has that content:
        the check and the write happen under one lock, so an edit can't slip in between.
        """
        text = safe_text(text)
        if (error := limit_error(name, text)) is not None:
            raise ValueError(error)
        with self._history_lock():
            if expect is not None and sha(self.read(name)) != expect:
                raise FileChanged(name)
            unconfirmed: NotDurable | None = None  # a version kept whose folder's fsync failed: written all the same
            try:
                self._snapshot(name, "on-disk")  # a person's edit, or the deploy's original
            except NotDurable as exc:
                unconfirmed = exc
            try:
                version = self._keep(name, text, source)
            except NotDurable as exc:
                unconfirmed = exc
            atomic_write(self.path(name), text.encode("utf-8"), mode=0o644)
            if unconfirmed is not None:  # the file is written too: NotDurable, not a failure
                raise unconfirmed
        return version

    def snapshot(self, name: str, source: str) -> Version | None:
        """Keep the file's current text as a version, unless the latest version already is it."""
        with self._history_lock():
            return self._snapshot(name, source)

    def _snapshot(self, name: str, source: str) -> Version | None:
        current = self.read(name)
        latest = self.latest_version(name)
        if current and (latest is None or sha(latest.text) != sha(current)):
            return self._keep(name, current, source)
        return None

    @contextlib.contextmanager
    def _history_lock(self) -> Iterator[None]:
        """Version numbers are allocated under a lock: the daemon and an operator's rollback may race."""
        make_dirs(self.history_dir)
        with held(self.history_dir / ".lock"):
            yield

    def install_template(self, name: str, text: str, source: str) -> bool:
        """What a deploy does: rewrite a deploy-managed file (keeping the version it replaces, a
        person's edit included), or create a curated file that doesn't exist yet. True if written."""
        if SPECS[name].owner == "deploy":
            if self.read(name) == text:
                return False
        elif self.path(name).exists():
            return False
        self.write(name, text, source)
        return True

    def history(self, name: str) -> list[Version]:
        folder = self.history_dir / self.path(name).name
        out = []
        for entry in folder.glob("*.md") if folder.is_dir() else ():
            if m := VERSION_NAME.match(entry.name):
                out.append(Version(int(m[1]), float(m[2]), m[3], entry))
        return sorted(out, key=lambda v: v.number)

    def latest_version(self, name: str) -> Version | None:
        versions = self.history(name)
        return versions[-1] if versions else None

    def rollback(self, name: str, number: int) -> Version:
        """Make version `number` current again, as a new version (history only grows)."""
        for version in self.history(name):
            if version.number == number:
                return self.write(name, version.text, f"rollback-to-{number}")
        raise KeyError(f"{name} has no version {number}")

    def redact_history(self, name: str, change: Callable[[str], str]) -> int:
        """Rewrite every kept version of `name` through `change` (a forget takes text out of them),
        in place: a version keeps its number, date and source. Returns how many changed."""
        changed = 0
        with self._history_lock():
            for version in self.history(name):
                try:
                    text = version.text
                except OSError:
                    continue
                if (new := change(text)) != text:
                    atomic_write(version.path, new.encode("utf-8"), mode=0o600)
                    changed += 1
        return changed

    def _keep(self, name: str, text: str, source: str) -> Version:
        folder = self.history_dir / name
        latest = self.latest_version(name)
        number = (latest.number if latest else 0) + 1
        slug = re.sub(r"[^a-z0-9-]+", "-", source.lower()).strip("-") or "unknown"
        now = time.time()
        path = folder / f"{number:06d}_{int(now)}_{slug}.md"
        atomic_write(path, text.encode("utf-8"), mode=0o600)
        return Version(number, now, slug, path)


def install_templates(layout: Layout, directory: Path, source: str) -> list[str]:
    """Install a release's templates (`directory` holds one per file), as a deploy and dev mode
    do: the names written. A missing or over-limit template is a release bug, found before
    anything is written."""
    texts: dict[str, str] = {}
    for name in SPECS:
        try:
            texts[name] = (directory / name).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"template {directory / name} is missing or unreadable: {exc.strerror}") from None
        if (error := limit_error(name, texts[name])) is not None:
            raise ConfigError(f"template {name}: {error}")
    layout.memory_dir.mkdir(parents=True, exist_ok=True)
    files = MemoryFiles(layout)
    return [name for name, text in texts.items() if files.install_template(name, text, source)]
