"""Sprite OS: one asyncio process that serves a user's agent and curates its memory."""

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
# The folder that holds the package: a checkout (os_src/..) or a deployed release (releases/<v>/src/..).
# VERSION and bootstrap/ sit in it in both.
RELEASE_DIR = PACKAGE_DIR.parent


def _read_version() -> str:
    try:
        return (RELEASE_DIR / "VERSION").read_text().strip()
    except OSError:
        return "0+unknown"


__version__ = _read_version()
