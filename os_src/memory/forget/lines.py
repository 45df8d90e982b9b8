"""Which file lines came from the forgotten turns: the pure rules a forget judges lines by.

A line came from the turns when most of its meaningful words are theirs (`came_from`), or, with the
dense retriever, when its vector is close to them and closer to them than to anything kept (`reworded`);
either way not when a kept turn or learning near it says it as well (`kept_holds`). Lines are known by
their hash (`line_hash`), which is all a forget's job keeps on disk, and leave a text by `without`;
`Lines` is the set of them a forget judges.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from ..recall.learnings import STOPWORDS
from ..transcript_store import Observation

# The note that stands where a forget took lines out of an older version, a batch's record or a backup.
REMOVED = "(text removed here: a person forgot the turn it came from, on {day})"

_WORD = re.compile(r"\w+", re.UNICODE)
# Search's stop words, and the words every memory file says of whoever it is about: they tell nothing
# of where a line came from.
COMMON_WORDS = STOPWORDS | {"user", "person", "agent", "sprite"}


# Characters folded by one call into the regular expression engine, which holds the GIL throughout:
# an 8 MB turn's words in one call held it (and so the event loop, while a thread folds them) 170 ms.
FOLD_CHUNK = 65_536


def content_words(text: str) -> set[str]:
    """The words that carry meaning, folded: case, plural s, common words left out."""
    out = set()
    for chunk in _chunks(text):
        for word in _WORD.findall(unicodedata.normalize("NFKC", chunk).casefold()):
            if len(word) < 2 or word in COMMON_WORDS:
                continue
            out.add(word[:-1] if len(word) > 3 and word.endswith("s") and not word.endswith("ss") else word)
    return out


def _chunks(text: str) -> Iterable[str]:
    """`text` in pieces of about FOLD_CHUNK characters, cut after a space (a word is never cut, unless
    one runs past a whole piece)."""
    start = 0
    while len(text) - start > FOLD_CHUNK:
        end = text.rfind(" ", start + 1, start + FOLD_CHUNK) + 1 or start + FOLD_CHUNK
        yield text[start:end]
        start = end
    yield text[start:]


def turn_text(obs: Observation) -> str:
    """What a turn said, for its words: the message, the answer, each tool call's input and output."""
    parts = [obs.user_message, obs.agent_response]
    with contextlib.suppress(ValueError, TypeError):
        for call in json.loads(obs.tool_calls_json):
            if isinstance(call, dict):
                parts += [str(call.get("input", "")), str(call.get("output", ""))]
    return "\n".join(parts)


def came_from(line: str, forgotten: set[str]) -> bool:
    """A file line came from the forgotten turns when more than half of its meaningful words were
    in them ("- Lives in: Lisbon" after "I live in Lisbon"); a heading, a note or a line of common
    words alone never does."""
    if not meaningful(line):
        return False
    words = content_words(line)
    return bool(words) and len(words & forgotten) * 2 > len(words)


def words_of(texts: Iterable[str]) -> set[str]:
    """The words of all the texts (`content_words`)."""
    out: set[str] = set()
    for text in texts:
        out |= content_words(text)
    return out


def lines_from(lines: dict[str, str], forgotten: set[str]) -> set[str]:
    """The lines (hash: text) that came from the forgotten words (`came_from`): their hashes."""
    return {h for h, text in lines.items() if came_from(text, forgotten)}


def kept_holds(line: str, kept: Sequence[str]) -> bool:
    """Whether a kept turn or learning near the line (`kept`: what recall finds) says most of its words
    too: then the line is as much that turn's, and it stays, however much of it the forgotten turns
    said (precision first: a kept fact removed is removed from every version, for good). "- Father's
    birthday: 9 May" stays after forgetting "My mother's birthday is on 3 May" when another turn said
    the father's; so does a fact two turns said, when one of them is forgotten."""
    return any(came_from(line, content_words(text)) for text in kept)


def meaningful(line: str) -> bool:
    """A line that can have come from a turn: not empty, not a heading, not a forget's note."""
    text = line.strip()
    return bool(text) and not text.startswith("#") and not text.startswith(REMOVED.split(":", 1)[0])


# The meaning rule (multilingual-e5-small passages' cosine). A line counts as the curator's rewording of
# a forgotten turn (or of a learning drawn from it) when its cosine to them is at least DENSE_THRESHOLD
# and exceeds its cosine to every kept turn and learning near it by DENSE_MARGIN: a line another, kept
# turn still says stays. Chosen on bench/forget_lines.py's tuning part (near misses on the same subject
# included) for precision 1.0; docs/memory.md gives both parts' precision and recall.
DENSE_THRESHOLD = 0.87
DENSE_MARGIN = 0.03


def reworded(to_forgotten: float, to_kept: float, threshold: float = DENSE_THRESHOLD,
             margin: float = DENSE_MARGIN) -> bool:
    """Whether a line whose nearest forgotten anchor is at cosine `to_forgotten`, and nearest kept turn
    or learning at `to_kept` (-1 when none is known), came from the forgotten turns."""
    return to_forgotten >= threshold and to_forgotten - to_kept > margin


def nearest(anchors: np.ndarray, lines: np.ndarray) -> list[float]:
    """For each line's vector (rows of `lines`), its cosine to the nearest anchor; -1 with no anchor.
    Vectors are unit length: the dot is the cosine."""
    if not len(anchors) or not len(lines):
        return [-1.0] * len(lines)
    return [float(s) for s in (lines @ anchors.T).max(axis=1)]


def line_hash(line: str) -> str:
    return hashlib.sha256(line.strip().encode()).hexdigest()


def meaningful_lines(text: str) -> dict[str, str]:
    """The `meaningful` lines of a text, once each: hash, the line stripped."""
    return {line_hash(line): line.strip() for line in text.splitlines() if meaningful(line)}


def without(text: str, hashes: set[str], note: str | None = None) -> str:
    """`text` without the lines whose hash is in `hashes`; with `note`, one note stands for each run
    of removed lines."""
    out: list[str] = []
    removing = False
    for line in text.splitlines(keepends=True):
        if line.strip() and line_hash(line) in hashes:
            if note is not None and not removing:
                out.append(note + "\n")
            removing = True
            continue
        removing = False
        out.append(line)
    return "".join(out)


@dataclass
class Lines:
    """The lines a forget judges, by hash. `files`: the curated files', their versions' and the batches'
    records' (the meaning judges them too); `backups`: v1's memory files' (the words alone); `current`:
    those in the curated files as they are now."""

    files: dict[str, str]
    backups: dict[str, str]
    current: set[str]

    def texts(self) -> dict[str, str]:
        return {**self.backups, **self.files}

    def split(self) -> tuple[Lines, Lines]:
        """The current files' lines, and the others (their history, the batches' records, the backups)."""
        current = self.current
        return (Lines({h: t for h, t in self.files.items() if h in current}, {}, current),
                Lines({h: t for h, t in self.files.items() if h not in current},
                      {h: t for h, t in self.backups.items() if h not in current}, current))
