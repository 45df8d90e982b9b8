"""The server limits glibc's malloc arenas (found by `make chaos`'s long run: RSS 240 -> 410 MiB
over 450 turns with the default, 220 -> 264 MiB with 2 arenas)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from sprite_os.malloc_arenas import limit_arenas

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")


def _in_child(code: str, **env: str) -> str:
    """Run `code` in a fresh interpreter (the setting is process-wide)."""
    child_env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"} | env
    return subprocess.run([sys.executable, "-c", code], env=child_env, capture_output=True, text=True,
                          check=True).stdout.strip()


@glibc
def test_glibc_takes_the_limit() -> None:
    assert _in_child("from sprite_os.malloc_arenas import limit_arenas; print(limit_arenas())") == "True"


def test_an_operators_setting_stands(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert limit_arenas() is False
