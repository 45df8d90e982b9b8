"""What `pip install .` installs: the product, and nothing of the kits beside it in the checkout.

devkit/ (dev mode, the mock Bridge, the harness), tests/, bench/ and chaos/ run from the checkout
(`make run`, `make test`, `make bench`, `make chaos`); a wheel built from it carries `sprite_os`
(os_src/, its console's static files) and the one `sprite-os` command. A deploy ships no wheel
(build_release.py packs os_src/ as src/; test_deploy.py checks the tarball), but a `pip install`
of the project must not carry the test kit either.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from devkit.processes import uncovered_env

pytestmark = pytest.mark.long  # a wheel's build (pip)

REPO = Path(__file__).resolve().parents[1]
VERSION = (REPO / "VERSION").read_text().strip()
# What a clone has that git does not (the venv, caches, results): the rest is copied as it is.
NOT_IN_A_CLONE = (".git", ".venv", "__pycache__", "*.egg-info", "build", "dist", ".workspace", ".coverage*",
                  ".pytest_cache", ".ruff_cache", ".mypy_cache", "results")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[zipfile.ZipFile]:
    """The wheel `pip wheel --no-deps` builds from a copy of the checkout (the build writes into
    the tree it builds: never this one, which other tests read while it runs)."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "checkout"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(*NOT_IN_A_CLONE))
    # pip runs none of the measured code: without coverage in it and its build's subprocesses, it takes
    # a third less CPU under `make test`
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--disable-pip-version-check",
                    "--wheel-dir", str(root / "out"), str(source)], check=True, timeout=600, env=uncovered_env())
    [built] = (root / "out").glob("*.whl")
    assert built.name == f"sprite_os-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(built) as zf:
        yield zf


@pytest.mark.e2e  # pip builds it, with setuptools from the index
def test_the_wheel_holds_the_product_and_none_of_the_kits(wheel: zipfile.ZipFile) -> None:
    names = wheel.namelist()
    assert {n.split("/", 1)[0] for n in names} == {"sprite_os", f"sprite_os-{VERSION}.dist-info"}
    source = {"sprite_os/" + p.relative_to(REPO / "os_src").as_posix()
              for p in (REPO / "os_src").rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    assert not source - set(names), "every file of os_src/ is in the wheel"
    assert "sprite_os/console/static/index.html" in names and "sprite_os/py.typed" in names
    entry_points = wheel.read(f"sprite_os-{VERSION}.dist-info/entry_points.txt").decode()
    assert entry_points.split() == ["[console_scripts]", "sprite-os", "=", "sprite_os.commands.main:main"]


def test_the_wheels_pip_runs_without_coverage(tmp_path: Path) -> None:
    """The build's pip is started without coverage's subprocess patch (it measures none of our code):
    a child of this venv's python given that environment does not load coverage; given this one's, it does."""
    measured = {**os.environ, "COVERAGE_PROCESS_START": str(REPO / "pyproject.toml"),
                "COVERAGE_FILE": str(tmp_path / ".coverage")}
    probe = [sys.executable, "-c", "import sys; print('coverage' in sys.modules)"]
    loaded = [subprocess.run(probe, env=env, capture_output=True, text=True, check=True).stdout.strip()
              for env in (measured, uncovered_env(measured))]
    assert loaded == ["True", "False"]
