"""Which of a forget's lines came from its turns, judged: by their words, or, with the dense retriever,
by their meaning (the vectors of the lines kept in memory between forgets); and never a line a kept turn
or learning near it says as well. A check that cannot be made (the kept-turn search fails) takes no
line out: CheckFailed."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ...logs import get_logger
from ..recall.episodes import EMBED_CHARS
from .lines import DENSE_THRESHOLD, Lines, kept_holds, line_hash, nearest, reworded

log = get_logger(__name__)

Embed = Callable[[Sequence[str]], Awaitable["np.ndarray | None"]]  # passages' unit vectors; None: no dense model
# For each line (its text; whether by meaning too, or by words alone), what the kept turns and
# learnings nearest to it say (recall's search, which no longer finds the forgotten ones).
KeptNear = Callable[[Sequence[tuple[str, bool]]], Awaitable[list[list[str]]]]
LINES_EMBEDDED_AT_ONCE = 64  # on the embedder's thread, between its other work
# Of each text a forget embeds (a forgotten turn, a kept one near a line), its first characters: as
# many as a turn's vector in recall holds (episodes.EMBED_CHARS). The model reads all it is given, in
# time linear in its length: an 8 MB turn held the embedder's thread for hours (and a stop, for ever).
EMBEDDED_CHARS = EMBED_CHARS
# Line vectors kept in memory between forgets (1.5 KiB each), the least recently used let go first:
# embedding a line costs ~20 ms, and a person often forgets several turns one after the other.
LINE_VECTORS_KEPT = 5_000
KEPT_CHECK_TIMEOUT = 120.0  # seconds the kept-turn search may take before it counts as failed


class CheckFailed(Exception):
    """The kept-turn check could not be made: no line it would judge leaves."""


@dataclass
class LineJudge:
    """Judges a forget's lines (`found`), with the dense retriever's embedder (`embed`) and recall's
    search for what is kept near a line (`kept_near`)."""

    embed: Embed | None = None  # the dense retriever's, to find reworded lines; None: by words alone
    kept_near: KeptNear | None = None  # what still supports a line; None: the threshold alone decides
    # line hash -> its vector, in memory only, least recently used first
    _line_vectors: OrderedDict[str, np.ndarray] = field(default_factory=OrderedDict)

    async def found(self, by_words: set[str], anchor_texts: Sequence[str], lines: Lines) -> set[str]:
        """The lines (hash: text) that came from the forgotten turns: most of their words are the
        turns' (`by_words`, found by `came_from`), or, with the dense retriever, the curator reworded
        them (close to the turns and their learnings, `anchor_texts`, and closer to them than to what is
        kept: `reworded`); and no kept turn or learning near the line says it as well (`kept_holds`).
        CheckFailed when the kept-turn search fails: no line is taken out unchecked."""
        texts = lines.texts()
        # The words' lines need no vector: the meaning only adds lines, and only the kept-turn check takes away.
        by_meaning = [(h, text) for h, text in lines.files.items() if h not in by_words]
        scored = await self._scored(by_meaning, anchor_texts) if anchor_texts else {}
        check = [h for h in texts if h in by_words or (h in scored and scored[h][0] >= DENSE_THRESHOLD)]
        if not check:
            return set()
        near = await self._kept_near([(texts[h], h not in by_words) for h in check])
        to_kept = await self._kept_scores(near, np.stack([scored[h][1] for h in check if h in scored])
                                          if any(h in scored for h in check) else None, [h in scored for h in check])
        came = [(h, texts[h], found) for h, found, kept in zip(check, near, to_kept, strict=True)
                if h in by_words or (h in scored and reworded(scored[h][0], kept))]
        # Each kept turn's whole text (its tool outputs too) folded into words: off the loop.
        held = await asyncio.to_thread(lambda: [kept_holds(text, found) for _, text, found in came])
        out = {h for (h, _, _), kept in zip(came, held, strict=True) if not kept}
        for h in out:  # they leave every file: no forget needs them again
            self._line_vectors.pop(h, None)
        log.info("forget_lines_found", candidates=len(texts), checked=len(check), by_words=len(by_words),
                 found=len(out))
        return out

    async def _vectors(self, texts: Sequence[str], keep: bool = True) -> np.ndarray | None:
        """The texts' vectors: those kept from before, the others embedded (in batches, on the embedder's
        thread) and kept (`keep`: never a forgotten turn's); None without the dense model or when it fails."""
        if self.embed is None or not texts:
            return None
        keys = [line_hash(text) for text in texts]
        cache = self._line_vectors
        todo = list({k: text for k, text in zip(keys, texts, strict=True) if k not in cache}.items())
        step = LINES_EMBEDDED_AT_ONCE
        found: dict[str, np.ndarray] = {}
        try:
            for i in range(0, len(todo), step):
                part = await self.embed([text[:EMBEDDED_CHARS] for _, text in todo[i:i + step]])
                if part is None:
                    return None
                found.update((k, part[j]) for j, (k, _) in enumerate(todo[i:i + step]))
        except Exception as exc:  # the model failed: the words still find what they find
            log.error("forget_embedding_failed", error=type(exc).__name__)
            return None
        out = np.stack([found[k] if k in found else cache[k] for k in keys]).astype(np.float32)
        for k in keys:  # used now: the last to be let go
            if k in cache:
                cache.move_to_end(k)
        if keep:
            cache.update(found)
        while len(cache) > LINE_VECTORS_KEPT:
            cache.popitem(last=False)
        return out

    async def _scored(self, todo: list[tuple[str, str]], anchor_texts: Sequence[str]
                      ) -> dict[str, tuple[float, np.ndarray]]:
        """With the dense retriever, each line of `todo` (hash, text): its cosine to the nearest anchor
        and its vector; without it (or when it fails), nothing."""
        anchors = await self._vectors(anchor_texts, keep=False) if todo else None
        if anchors is None:
            return {}
        vectors = await self._vectors([text for _, text in todo])
        if vectors is None:
            return {}
        scores = nearest(anchors, vectors)
        return {h: (scores[i], vectors[i]) for i, (h, _) in enumerate(todo)}

    async def _kept_near(self, lines: Sequence[tuple[str, bool]]) -> list[list[str]]:
        if self.kept_near is None:
            return [[] for _ in lines]
        limit = asyncio.timeout(KEPT_CHECK_TIMEOUT)
        try:
            async with limit:
                return await self.kept_near(lines)
        except TimeoutError as exc:
            if limit.expired():
                raise CheckFailed(f"the kept-turn search took over {KEPT_CHECK_TIMEOUT:g} s") from exc
            raise CheckFailed(f"the kept-turn search gave up: {exc}") from exc  # the word index behind, say
        except Exception as exc:
            raise CheckFailed(f"the kept-turn search failed: {type(exc).__name__}: {exc}") from exc

    async def _kept_scores(self, near: Sequence[Sequence[str]], vectors: np.ndarray | None,
                           scored: Sequence[bool]) -> list[float]:
        """Each line's cosine to the nearest of the kept turns and learnings found for it (`near`), for
        the lines with a vector (`scored`; `vectors` in their order); +1 when they can't be embedded
        (precision first: a line that can't be checked by meaning stays), -1 for the others."""
        if vectors is None or not any(scored):
            return [-1.0] * len(near)
        texts = [text for found, has in zip(near, scored, strict=True) if has for text in found]
        kept = await self._vectors(texts) if texts else np.zeros((0, vectors.shape[1]), dtype=np.float32)
        if kept is None:
            return [1.0 if has else -1.0 for has in scored]
        out, at, row = [], 0, 0
        for found, has in zip(near, scored, strict=True):
            if not has:
                out.append(-1.0)
                continue
            out.append(nearest(kept[at:at + len(found)], vectors[row:row + 1])[0])
            at += len(found)
            row += 1
        return out
