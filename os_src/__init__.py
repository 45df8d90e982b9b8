"""Sprite OS: one asyncio process that serves a user's agent and curates its memory."""

from pathlib import Path


def _read_version() -> str:
    # The VERSION file sits beside the package's directory both in a checkout
    # (os_src/../VERSION) and in a deployed release (releases/<v>/src/../VERSION).
    try:
        return (Path(__file__).resolve().parent.parent / "VERSION").read_text().strip()
    except OSError:
        return "0+unknown"


__version__ = _read_version()
