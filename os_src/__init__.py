"""Sprite OS: one asyncio process that serves a user's agent and curates its memory."""

import os
from pathlib import Path

# One thread each for OpenBLAS and OpenMP, set before anything imports numpy or the embedding
# engine: they read it once, when they load (setting it later changes nothing). A vector search
# is one small matrix product, and a pool of threads spinning for it on a 2-core Sprite doubled
# its CPU. An operator's own setting stands. (The agent's CLI does not inherit these.)
for _threads in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_threads, "1")

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
