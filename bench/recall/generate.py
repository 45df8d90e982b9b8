"""A reproducible recall benchmark: one person's long conversation with their agent over five years,
questions whose answers sit in known turns, and Zipf-distributed filler to scale the haystack.

    python -m bench.recall.generate OUT_DIR [--seed=7]

writes OUT_DIR/turns.jsonl (one turn a line, in `sprite-os memory import` form:
session, timestamp, user, assistant) and OUT_DIR/questions.jsonl (question, asked_at,
evidence as (session, turn) with turn 1-based, answer, category, conversation).

The benchmark is ten conversations of six months each (2021-2025), 40 sessions of 16
turns: 6,400 turns and 1,500 questions. What makes it honest:
- a question says its facts in other words than its evidence (CONCEPTS), and a third of
  facts are split over two turns: the cue words in one, the answer in the next;
- the same twenty people, topics and everyday words recur in every conversation and in
  the filler, so an old fact competes with many newer turns that share its words;
- distractor turns state a fact of the same kind about the same person or topic;
- temporal questions ("what did I decide about the mortgage last spring?") ask for one of
  several decisions on the same topic, and update questions ("where does Tom live now?")
  for the latest of several states; both are scored by their evidence turn alone.

`filler_sessions` and `filler_learnings` scale the haystack (to 1M + 1M) with turns and
learnings drawn from the same people, topics, fact templates and a Zipf vocabulary of
real English word frequencies (words.txt, taken from wordfreq), so the benchmark can be placed before or after
them and the oldest and newest conversations measured apart.
"""

from __future__ import annotations

import argparse
import calendar
import itertools
import json
import random
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from . import lexicon as L

CONVERSATIONS = 10
SESSIONS = 40
TURNS = 16
PLAIN_FACTS = 115
DECISION_THREADS = 10  # three decisions each, each asked about
UPDATE_THREADS = 5  # three states each, the latest asked about
SPLIT_SHARE = 0.35
DISTRACTOR_SHARE = 0.5
SAME_WORDING = 0.3  # chance a question says a concept as its evidence did
FIRST_YEAR = 2021
SEASONS = {"winter": (12, 1, 2), "spring": (3, 4, 5), "summer": (6, 7, 8), "autumn": (9, 10, 11)}

_SLOT = re.compile(r"\{(~?)(\w+)\}")


@dataclass
class Turn:
    session: str
    turn: int  # 1-based within its session
    timestamp: float
    user: str
    assistant: str


@dataclass
class Question:
    id: str
    conversation: int
    category: str  # plain | split | temporal | update
    question: str
    asked_at: float
    answer: str
    evidence: list[tuple[str, int]] = field(default_factory=list)
    window: tuple[float, float] | None = None  # temporal questions: the period meant


WORDS = Path(__file__).with_name("words.txt")


class Vocabulary:
    """Real English words with their frequencies (words.txt, from wordfreq): a Zipf law, for filler text."""

    def __init__(self, size: int = 30_000) -> None:
        words: list[str] = []
        freqs: list[float] = []
        for line in WORDS.read_text().splitlines():
            if line and not line.startswith("#"):
                freq, *group = line.split()
                words += group
                freqs += [float(freq)] * len(group)
        self.words = words[:size]
        self.cumulative = list(itertools.accumulate(freqs[:size]))

    def phrase(self, rng: random.Random, lo: int, hi: int) -> str:
        return " ".join(rng.choices(self.words, cum_weights=self.cumulative, k=rng.randint(lo, hi)))


def _fill(template: str, values: dict[str, str], wording: dict[str, int], rng: random.Random,
          same: float | None = None) -> str:
    """Fill `template`. A `{~concept}` keeps the variant in `wording` (chosen on first use);
    with `same` given, it is kept only with that chance, else another variant is used."""

    def pick(m: re.Match[str]) -> str:
        tilde, name = m.groups()
        if not tilde:
            return values[name]
        variants = L.CONCEPTS[name]
        if name not in wording:
            wording[name] = rng.randrange(len(variants))
        index = wording[name]
        if same is not None and len(variants) > 1 and rng.random() >= same:
            index = rng.choice([i for i in range(len(variants)) if i != index])
        return variants[index]

    text = _SLOT.sub(pick, template)
    return text[0].upper() + text[1:]


def _slots(template: str) -> set[str]:
    return {name for tilde, name in _SLOT.findall(template) if not tilde}


def _draw(kind: L.FactKind, rng: random.Random, names: set[str]) -> dict[str, str]:
    return {n: rng.choice(kind.pools.get(n) or L.POOLS[n]) for n in sorted(names)}


def _kind_slots(kind: L.FactKind) -> set[str]:
    templates = [*kind.evidence, *itertools.chain(*kind.split), *kind.questions]
    return set().union(*(_slots(t) for t in templates))


def _chat(rng: random.Random, vocab: Vocabulary) -> tuple[str, str]:
    person, topic = rng.choice(L.POOLS["person"]), rng.choice(L.CHAT_TOPICS)
    user = f"{rng.choice(L.CHAT_OPENERS)} {person} {rng.choice(L.CHAT_VERBS)} {topic}. {vocab.phrase(rng, 5, 16)}."
    reply = rng.choice(L.AGENT_CHAT).format(person=rng.choice(L.POOLS["person"]), topic=rng.choice(L.CHAT_TOPICS))
    user = user.strip()
    return user[0].upper() + user[1:], reply


def _ack(rng: random.Random, answer: str) -> str:
    ack = rng.choice(L.AGENT_ACKS)
    return f"{answer}, noted. {ack}" if rng.random() < 0.3 else ack


@dataclass
class _Plan:
    """What one conversation's turns hold: (session index, turn index) -> (user, assistant)."""

    slots: dict[tuple[int, int], tuple[str, str]] = field(default_factory=dict)

    def free(self, rng: random.Random, sessions: Sequence[int], width: int = 1) -> tuple[int, int]:
        for _ in range(10_000):
            s, t = rng.choice(sessions), rng.randrange(TURNS - width + 1)
            if all((s, t + i) not in self.slots for i in range(width)):
                return s, t
        raise RuntimeError("conversation is full")


class _Benchmark:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.vocab = Vocabulary()
        self.used_cues: set[tuple[str, ...]] = set()
        self.used_updates: set[tuple[str, str]] = set()

    def conversation(self, c: int) -> tuple[list[Turn], list[Question]]:
        rng = self.rng
        year, half = FIRST_YEAR + c // 2, c % 2
        start = datetime(year, 1 + 6 * half, 1, tzinfo=UTC)
        end = datetime(year + half, (7 + 6 * half - 1) % 12 + 1, 1, tzinfo=UTC)
        days = sorted(rng.sample(range((end - start).days), SESSIONS))
        dates = [start + timedelta(days=d, hours=rng.randint(7, 22), minutes=rng.randrange(60)) for d in days]
        asked = end + timedelta(days=rng.randint(3, 10), hours=12)
        plan, questions = _Plan(), list[Question]()
        session_ids = [f"c{c}-s{s:02d}" for s in range(SESSIONS)]
        every = list(range(SESSIONS))

        def place(rows: Sequence[tuple[str, str]], sessions: Sequence[int] = every) -> tuple[int, int]:
            s, t = plan.free(rng, sessions, len(rows))
            for i, row in enumerate(rows):
                plan.slots[(s, t + i)] = row
            return s, t + len(rows) - 1

        def question(category: str, text: str, answer: str, where: tuple[int, int],
                     window: tuple[datetime, datetime] | None = None) -> None:
            questions.append(Question(
                id=f"c{c}-q{len(questions):03d}", conversation=c, category=category, question=text,
                asked_at=asked.timestamp(), answer=answer, evidence=[(session_ids[where[0]], where[1] + 1)],
                window=(window[0].timestamp(), window[1].timestamp()) if window else None))

        for _ in range(PLAIN_FACTS):
            kind, values = self._fresh_fact()
            wording: dict[str, int] = {}
            answer = values[kind.answer]
            if rng.random() < SPLIT_SHARE:
                first, second = rng.choice(kind.split)
                rows = [(_fill(first, values, wording, rng), rng.choice(L.AGENT_CHAT).format(
                            person=values.get("person", "them"), topic="it")),
                        (_fill(second, values, wording, rng), _ack(rng, answer))]
                category = "split"
            else:
                rows = [(_fill(rng.choice(kind.evidence), values, wording, rng), _ack(rng, answer))]
                category = "plain"
            where = place(rows)
            text = _fill(rng.choice(kind.questions), values, wording, rng, same=SAME_WORDING)
            question(category, text, answer, where)
            if rng.random() < DISTRACTOR_SHARE:
                place([self._distractor(kind, values)])

        months = [(start.month + i - 1) % 12 + 1 for i in range(6)]
        for topic in rng.sample(L.DECISION_TOPICS, DECISION_THREADS):
            picks = rng.choice([(0, 2, 4), (0, 2, 5), (0, 3, 5), (1, 3, 5)])
            options = rng.sample(L.DECISION_OPTIONS, 3)
            for pick, option in zip(picks, options, strict=True):
                in_month = [s for s in every if dates[s].month == months[pick]]
                if not in_month:
                    continue
                values = {"topic": topic, "person": rng.choice(L.POOLS["person"]),
                          "month": rng.choice(L.POOLS["month"])}
                values["option"] = option.format(**values)
                wording = {}
                where = place([(_fill(rng.choice(L.DECISION_EVIDENCE), values, wording, rng), _ack(rng, "Decision"))],
                              in_month)
                when, window = _when(dates[where[0]], [months[p] for p in picks], asked, rng)
                values["when"], values["When"] = when, when[0].upper() + when[1:]
                text = _fill(rng.choice(L.DECISION_QUESTIONS), values, wording, rng, same=SAME_WORDING)
                question("temporal", text, values["option"], where, window)

        for _ in range(UPDATE_THREADS):
            while True:
                name, statements, asks, slot = rng.choice(L.UPDATE_KINDS)
                person = rng.choice(L.POOLS["person"])
                if (name, person) not in self.used_updates:
                    self.used_updates.add((name, person))
                    break
            states = rng.sample(L.UPDATE_POOLS.get(slot) or L.POOLS[slot], 3)
            thirds = [every[i * SESSIONS // 3:(i + 1) * SESSIONS // 3] for i in range(3)]
            said: dict[str, int] = {}
            for state, sessions in zip(states, thirds, strict=True):
                values = {"person": person, slot: state}
                where = place([(_fill(rng.choice(statements), values, said, rng), _ack(rng, state))], sessions)
            values = {"person": person}
            question("update", _fill(rng.choice(asks), values, said, rng, same=SAME_WORDING), states[-1], where)

        turns = []
        for s, t in itertools.product(range(SESSIONS), range(TURNS)):
            user, reply = plan.slots.get((s, t)) or _chat(rng, self.vocab)
            at = dates[s] + timedelta(minutes=2 * t)
            turns.append(Turn(session_ids[s], t + 1, at.timestamp(), user, reply))
        return turns, questions

    def _fresh_fact(self) -> tuple[L.FactKind, dict[str, str]]:
        rng = self.rng
        for _ in range(100_000):
            kind = rng.choice(L.FACT_KINDS)
            values = _draw(kind, rng, _kind_slots(kind))
            key = (kind.name, *(values[c] for c in kind.cues))
            if key not in self.used_cues:
                self.used_cues.add(key)
                return kind, values
        raise RuntimeError("fact kinds exhausted")

    def _distractor(self, kind: L.FactKind, values: dict[str, str]) -> tuple[str, str]:
        """A fact of the same kind that keeps one cue and changes the rest."""
        rng = self.rng
        other = _draw(kind, rng, _kind_slots(kind))
        keep = rng.choice(kind.cues)
        other[keep] = values[keep]
        return _fill(rng.choice(kind.evidence), other, {}, rng), _ack(rng, other[kind.answer])


def _month_window(year: int, month: int) -> tuple[datetime, datetime]:
    first = datetime(year, month, 1, tzinfo=UTC)
    return first, first + timedelta(days=calendar.monthrange(year, month)[1])


def _when(date: datetime, thread_months: Sequence[int], asked: datetime,
          rng: random.Random) -> tuple[str, tuple[datetime, datetime]]:
    """A way to say when `date` was, unique among the thread's months, and the period it means."""
    month_name = calendar.month_name[date.month]
    ways = [(f"in {month_name} {date.year}", _month_window(date.year, date.month)),
            (f"in {month_name}", _month_window(date.year, date.month))]  # the latest such month
    for season, season_months in SEASONS.items():
        if date.month in season_months and sum(m in season_months for m in thread_months) == 1:
            start_year = date.year - (1 if season == "winter" and date.month < 3 else 0)
            begin = datetime(start_year, season_months[0], 1, tzinfo=UTC)
            finish = _month_window(start_year + (season == "winter"), season_months[-1])[1]
            if finish <= asked and (asked - finish).days < 300:
                ways.append((f"last {season}", (begin, finish)))
            if season != "winter":
                ways.append((f"in the {season} of {start_year}", (begin, finish)))
    ago = (asked.year - date.year) * 12 + asked.month - date.month
    if ago >= 2 and all(abs(m - date.month) >= 2 for m in thread_months if m != date.month):
        ways.append((f"about {ago} months ago", _month_window(date.year, date.month)))
    return rng.choice(ways)


def benchmark(seed: int = 7) -> tuple[list[Turn], list[Question]]:
    bench = _Benchmark(seed)
    turns, questions = [], []
    for c in range(CONVERSATIONS):
        t, q = bench.conversation(c)
        turns += t
        questions += q
    return turns, questions


def filler_sessions(n_turns: int, seed: int, start: datetime, end: datetime,
                    prefix: str = "f") -> Iterator[Turn]:
    """`n_turns` turns in sessions of 4-30, dated evenly from `start` to `end` in order:
    everyday talk (70%) and facts of the benchmark's kinds, whose cue slots come from the
    Zipf vocabulary and other slots half from the kinds' own pools."""
    rng, vocab = random.Random(seed), Vocabulary()
    span = (end - start).total_seconds()
    done, s = 0, 0
    while done < n_turns:
        size = min(rng.randint(4, 30), n_turns - done)
        at = start.timestamp() + span * done / n_turns
        for t in range(size):
            user, reply = _filler_turn(rng, vocab)
            yield Turn(f"{prefix}{s}", t + 1, at + 120 * t, user, reply)
        done, s = done + size, s + 1


def _filler_turn(rng: random.Random, vocab: Vocabulary) -> tuple[str, str]:
    if rng.random() < 0.7:
        return _chat(rng, vocab)
    kind = rng.choice(L.FACT_KINDS)
    # A cue slot never comes from its pool: a filler fact never restates a benchmark fact's
    # cues with another answer, which would make its question ambiguous rather than hard.
    values = {n: rng.choice(kind.pools.get(n) or L.POOLS[n]) if n not in kind.cues and rng.random() < 0.5
              else vocab.phrase(rng, 1, 1) for n in sorted(_kind_slots(kind))}
    return _fill(rng.choice(kind.evidence), values, {}, rng), _ack(rng, values[kind.answer])


def filler_learnings(n: int, seed: int) -> Iterator[tuple[str, str]]:
    """(type, content) learnings in a curator's style, from the same people, kinds and words."""
    rng, vocab = random.Random(seed), Vocabulary()
    types = ("FACT", "PREFERENCE", "PATTERN", "CORRECTION", "ACTION")
    for _ in range(n):
        if rng.random() < 0.5:
            user, _ = _filler_turn(rng, vocab)
            content = user.split(". ")[0]
        else:
            name, relation = rng.choice(L.PEOPLE)
            content = (f"{name} (the user's {relation}) {rng.choice(L.CHAT_VERBS)} {rng.choice(L.CHAT_TOPICS)}: "
                       f"{vocab.phrase(rng, 4, 12)}")
        yield rng.choice(types), content


def write(out: Path, turns: Sequence[Turn], questions: Sequence[Question], **more: Sequence[object]) -> None:
    """The benchmark as JSON lines: turns.jsonl (`memory import`'s form), questions.jsonl, and any `more`."""
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in {"turns": turns, "questions": questions, **more}.items():
        with (out / f"{name}.jsonl").open("w") as f:
            for row in rows:
                f.write(json.dumps(asdict(row) if hasattr(row, "__dataclass_fields__") else row) + "\n")


def main(doc: str | None = __doc__, make: Callable[[Path, int], None] | None = None, seed: int = 7) -> None:
    parser = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=seed)
    args = parser.parse_args()
    if make is None:
        write(args.out, *benchmark(args.seed))
    else:
        make(args.out, args.seed)


if __name__ == "__main__":
    main()
