#!/usr/bin/env python3
"""Regenerate bootstrap/requirements.lock: the pinned transitive runtime requirements.

    python3 bootstrap/lock.py            # rebuild the lock in a clean temporary venv
    python3 bootstrap/lock.py --check    # only check that the lock pins pyproject's dependencies

The lock holds `pyproject.toml`'s `[project].dependencies` (not the dev and test extras) and
everything they pull in, exactly as `pip freeze` reports them in a fresh venv
where only those dependencies were installed. The project itself is never in it.
Run it with the Python the Sprites run (CPython 3.11, linux x86_64): wheels differ
by platform. Stdlib only.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "bootstrap" / "requirements.lock"

HEADER = """\
# Sprite OS runtime requirements, pinned with everything they pull in.
# GENERATED: do not edit. After changing [project].dependencies in pyproject.toml, run
#     python3 bootstrap/lock.py
# which installs those dependencies into a clean temporary venv and writes `pip freeze`
# here (pip and setuptools excluded, as pip freeze does). `python3 bootstrap/lock.py --check`
# checks that every pyproject pin is here. Generated with Python {python} on {platform}.
# A deploy builds one venv per distinct content of this file (.os/venvs/<sha256[:16]>).
"""


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def project_dependencies() -> list[str]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return list(data["project"]["dependencies"])


def locked(text: str) -> dict[str, str]:
    """{normalised name: version} of the `name==version` lines of a lock."""
    out = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            out[_norm(name)] = version.strip()
    return out


def check(lock_text: str, deps: list[str]) -> list[str]:
    """Problems: pyproject pins missing from the lock or locked at another version."""
    pins = locked(lock_text)
    problems = []
    for dep in deps:
        name, _, version = dep.partition("==")
        got = pins.get(_norm(name))
        if got is None:
            problems.append(f"{name} is not in the lock")
        elif version and got != version.strip():
            problems.append(f"{name} is locked at {got}, pyproject pins {version.strip()}")
    return problems


def generate(deps: list[str]) -> str:
    with tempfile.TemporaryDirectory(prefix="sprite-os-lock-") as tmp:
        venv = Path(tmp) / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
        subprocess.run([*pip, "install", "--quiet", *deps], check=True)
        frozen = subprocess.run([*pip, "freeze"], check=True, capture_output=True, text=True).stdout
    lines = sorted((ln for ln in frozen.splitlines() if ln and not ln.startswith("-e ")
                    and _norm(ln.split("==")[0]) != "sprite-os"), key=lambda ln: _norm(ln.split("==")[0]))
    header = HEADER.format(python=".".join(map(str, sys.version_info[:3])), platform=sys.platform)
    return header + "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="check the lock against pyproject.toml")
    args = parser.parse_args()
    deps = project_dependencies()
    if args.check:
        problems = check(LOCK.read_text(), deps)
        for problem in problems:
            print(f"lock: {problem}", file=sys.stderr)
        return 1 if problems else 0
    text = generate(deps)
    if problems := check(text, deps):
        print("lock: the generated lock misses pins: " + "; ".join(problems), file=sys.stderr)
        return 1
    LOCK.write_text(text)
    print(f"lock: wrote {LOCK.relative_to(ROOT)} ({len(locked(text))} packages)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
