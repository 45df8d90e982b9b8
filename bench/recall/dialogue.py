"""The dialogue benchmark: recall as hard as real conversations, generated from a seed.

    python -m bench.recall.dialogue OUT_DIR [--seed N]

writes OUT_DIR/turns.jsonl (`sprite-os memory import` form), OUT_DIR/questions.jsonl (question,
asked_at, evidence as (session, 1-based turn) pairs, answer, category) and OUT_DIR/unrelated.jsonl
(messages with nothing to recall, for auto-recall's floor).

One person's years with their agent, in ten eras of six months: 24 sessions each of 14 to 26
turns, most of them chit-chat and requests for help (long answers full of everyday words), the
same two dozen people named every way (Margaret, Mags, "my sister", "she") in facts and chatter
alike. What makes it as hard as real dialogue, by design:
- a question names its person another way than the evidence did (75%) and says the fact in
  its own words (its templates avoid the evidence's verbs);
- a fact may refer to its person by a pronoun, the name said only in the turn before;
- a fact may be split over two turns (the cue, then the answer: both are evidence), or over
  two to four sessions (a list: all are evidence; a chain: the name in one, the fact in the other);
- time: "when did ...?", "what did I cook in March 2023?", and "what did I buy the week before
  Mags's wedding?" (the wedding's day said in one turn, the purchase in another: both evidence);
- questions whose answer must be inferred ("would Pri enjoy a steakhouse dinner?");
- facts that change (where someone lives, works...: the latest state is the evidence);
- distractors: a fact of the same kind about someone else, and the agent mentioning a fact
  again sessions later (an echo).
Every evidence turn is marked; the generator never looks at what a retriever finds.
"""

from __future__ import annotations

import calendar
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from . import dialogue_world as W
from . import generate
from .generate import Question, Turn

ERAS = 10
SESSIONS = 24
TURNS = (14, 26)
FIRST_YEAR = 2021
FACTS = 57  # facts an era, each asked about
LISTS = 6
UPDATES = 3
ANCHORS = 6
CHAINS = 3
PERIODS = 7
SPLIT_SHARE = 0.12
PRONOUN_SHARE = 0.15
OTHER_NAME = 0.1  # a question names its person another way than the evidence
WHEN_SHARE = 0.5
INFER_SHARE = 0.35
NAMED_CHAT = 0.25  # chit-chat that names someone
PADDED = 0.4  # a fact with a word about the day before it (and, as often, a thought after)
DISTRACTOR_SHARE = 0.35
ECHO_SHARE = 0.08  # chit-chat replies where the agent brings up an earlier fact
REQUEST_SHARE = 0.2

_ALT = re.compile(r"\{([^{}]*\|[^{}]*)\}")
_SLOT = re.compile(r"\{(\w+)\}")
Row = tuple[str, str]


@dataclass(frozen=True)
class Person:
    name: str
    nick: str
    relation: str
    gender: str

    def forms(self) -> dict[str, str]:
        return {"name": self.name, "nick": self.nick, "rel": f"my {self.relation}"}


CAST = tuple(Person(*p) for p in (*W.PEOPLE, *W.PARENTS))


def mention(person: Person, form: str) -> dict[str, str]:
    """The values a template's person slots take for one way of naming the person."""
    sub, obj, pos = W.PRONOUNS[person.gender]
    said = sub if form == "pronoun" else person.forms()[form]
    if person.relation in ("mum", "dad") and form == "rel":
        said = person.nick  # "Mum" is how one names one's mum
    possessive = pos if form == "pronoun" else (said + "'" if said.endswith("s") else said + "'s")
    return {"p": said, "P": said[0].upper() + said[1:], "ps": possessive, "sub": sub, "Sub": sub.capitalize(),
            "obj": obj, "pos": pos, **({"pronoun": "yes"} if form == "pronoun" else {})}


_OBJECT = re.compile(r"\b(with|to|for|from|of|helped|told|asked|let|showed|gave|called|met|visited|about) \{p\}")


def fill(template: str, values: dict[str, str], rng: random.Random) -> str:
    text = _OBJECT.sub(r"\1 {obj}", template) if "pronoun" in values else template
    for _ in range(3):  # a value may hold a template of its own ("{pos} birthday")
        text = _ALT.sub(lambda m: rng.choice(m[1].split("|")), text)
        text = _SLOT.sub(lambda m: values.get(m[1], m[0]), text)
    text = re.sub(r"\s+", " ", text).strip()
    return text[0].upper() + text[1:] if text else text


@dataclass
class Segment:
    """Turns that go together in one session; `tags` mark evidence turns by their index."""

    rows: list[Row]
    tags: dict[int, str] = field(default_factory=dict)
    sessions: Sequence[int] | None = None  # where it may go (None: anywhere)


@dataclass
class Pending:
    """A question whose evidence is known by tag until the turns are laid out."""

    category: str
    question: str
    answer: str
    tags: list[str]
    window: tuple[float, float] | None = None


class _Era:
    def __init__(self, bench: _Bench, c: int) -> None:
        self.bench, self.c, self.rng = bench, c, bench.rng
        rng = self.rng
        start = datetime(FIRST_YEAR + c // 2, 1 + 6 * (c % 2), 1, tzinfo=UTC)
        self.start, self.end = start, _add_months(start, 6)
        days = sorted(rng.sample(range((self.end - start).days), SESSIONS))
        self.dates = [start + timedelta(days=d, hours=rng.randint(7, 21), minutes=rng.randrange(60)) for d in days]
        self.asked = self.end + timedelta(days=rng.randint(3, 10), hours=12)
        self.sizes = [rng.randint(*TURNS) for _ in range(SESSIONS)]
        self.placed: list[list[Segment]] = [[] for _ in range(SESSIONS)]
        self.pending: list[Pending] = []
        self.said: list[tuple[int, Kind_, dict[str, str]]] = []  # (session, kind, values): for echoes
        self.kind_days: dict[str, list[datetime]] = {}
        self._tag = 0

    # ------------------------------------------------------------ placing turns

    def tag(self) -> str:
        self._tag += 1
        return f"c{self.c}-t{self._tag}"

    def room(self, s: int) -> int:
        return self.sizes[s] - sum(len(seg.rows) for seg in self.placed[s])

    def place(self, seg: Segment) -> int:
        choices = [s for s in (seg.sessions if seg.sessions is not None else range(SESSIONS))
                   if self.room(s) >= len(seg.rows) + 2]
        if not choices:
            choices = list(seg.sessions if seg.sessions is not None else range(SESSIONS))
            s = self.rng.choice(choices)
            self.sizes[s] += len(seg.rows)
        else:
            s = self.rng.choice(choices)
        self.placed[s].append(seg)
        return s

    # ------------------------------------------------------------ one fact

    def person(self, free: Callable[[Person], bool]) -> Person | None:
        options = [p for p in CAST if free(p)]
        return self.rng.choice(options) if options else None

    def forms(self, person: Person) -> tuple[str, str]:
        """How the evidence names the person, and how the question does."""
        rng = self.rng
        said = rng.choices(("name", "nick", "rel"), (0.3, 0.35, 0.35))[0]
        asked = rng.choice([f for f in ("name", "nick", "rel") if f != said]) if rng.random() < OTHER_NAME else said
        return said, asked

    def reply(self, kind: Kind_, values: dict[str, str]) -> str:
        rng = self.rng
        first = fill(rng.choice(kind.reply), values, rng) if kind.reply and rng.random() < 0.5 else ""
        return (first + " " + fill(rng.choice(W.CHAT_REPLIES), values, rng)).strip() \
            if not first or rng.random() < 0.5 else first

    def padded(self, text: str, values: dict[str, str]) -> str:
        """A fact said among other things, as people do: a word about the day before it, a thought after."""
        rng = self.rng
        if rng.random() < PADDED:
            text = fill(rng.choice(W.DAY), values, rng) + " " + text
        if rng.random() < PADDED:
            text += " " + fill(rng.choice([m for m in W.MUSING if "{" not in m]), values, rng)
        return text

    def statement(self, kind: Kind_, values: dict[str, str], person: Person, form: str,
                  sessions: Sequence[int] | None = None) -> tuple[Segment, list[int]]:
        """The fact as turns: whole, split over two, or after a turn that names its person
        (then said with a pronoun). Returns the segment and the indexes of its evidence."""
        rng = self.rng
        said = values | mention(person, form)
        roll = rng.random()
        if roll < SPLIT_SHARE and kind.split:
            cue, answer = rng.choice(kind.split)
            rows = [(self.padded(fill(cue, said, rng), said), fill(rng.choice(W.CHAT_REPLIES), said, rng)),
                    (fill(answer, values | mention(person, "pronoun"), rng), self.reply(kind, said))]
            return Segment(rows, sessions=sessions), [0, 1]
        if roll < SPLIT_SHARE + PRONOUN_SHARE:
            lead = self.padded(fill(rng.choice(LEADS), said, rng), said)
            told = fill(rng.choice(kind.say), values | mention(person, "pronoun"), rng)
            rows = [(lead, fill(rng.choice(LEAD_REPLIES), said, rng)), (told, self.reply(kind, said))]
            return Segment(rows, sessions=sessions), [1]
        told = self.padded(fill(rng.choice(kind.say), said, rng), said)
        return Segment([(told, self.reply(kind, said))], sessions=sessions), [0]

    def fact(self) -> None:
        rng = self.rng
        for _ in range(200):
            kind = rng.choice(W.KINDS)
            values = {k: rng.choice(v) for k, v in kind.slots.items()}
            person = self.person(lambda p, k=kind, v=values: k.fits(p.relation) and self.bench.free(_key(k, p, v)))
            if person is not None:
                break
        else:
            return
        self.bench.take(_key(kind, person, values))
        said, asked = self.forms(person)
        seg, evidence = self.statement(kind, values, person, said)
        tags = [self.tag() for _ in evidence]
        seg.tags = dict(zip(evidence, tags, strict=True))
        s = self.place(seg)
        self.said.append((s, kind, values | mention(person, said)))
        self.kind_days.setdefault(kind.name, []).append(self.dates[s])
        q_values = values | mention(person, asked)
        category = "multi" if len(tags) > 1 else "single"
        self.pending.append(Pending(category, fill(rng.choice(kind.ask), q_values, rng),
                                    _answer(kind, person, q_values, rng), tags))
        if kind.when and rng.random() < WHEN_SHARE:
            day = self.dates[s].strftime("%d %B %Y")
            self.pending.append(Pending("temporal", fill(rng.choice(kind.when), q_values, rng), day, tags))
        if kind.infer and rng.random() < INFER_SHARE:
            question, answer = rng.choice(kind.infer)
            self.pending.append(Pending("inferred", fill(question, q_values, rng), fill(answer, q_values, rng), tags))
        if rng.random() < DISTRACTOR_SHARE:
            self.distractor(kind, person)

    def distractor(self, kind: Kind_, person: Person) -> None:
        """The same kind of fact about someone else, with other values: not an answer, a near miss."""
        rng = self.rng
        other = self.person(lambda p: p != person and kind.fits(p.relation) and self.bench.free(_key(kind, p, {})))
        if other is None:
            return
        values = {k: rng.choice(v) for k, v in kind.slots.items()}
        if not self.bench.free(_key(kind, other, values)):
            return
        self.bench.take(_key(kind, other, values))
        said = values | mention(other, rng.choice(("name", "nick", "rel")))
        self.place(Segment([(fill(rng.choice(kind.say), said, rng), self.reply(kind, said))]))

    # ------------------------------------------------------------ facts over several turns

    def list_thread(self) -> None:
        rng = self.rng
        name, says, asks, pool = rng.choice(W.LISTS)
        person = self.person(lambda p: self.bench.free(("list", name, p.name)))
        if person is None:
            return
        self.bench.take(("list", name, person.name))
        items = rng.sample(pool, rng.randint(2, 4))
        thirds = _split(list(range(SESSIONS)), len(items))
        tags = []
        for item, sessions in zip(items, thirds, strict=True):
            said = {"value": item} | mention(person, rng.choice(("name", "nick", "rel")))
            tag = self.tag()
            tags.append(tag)
            self.place(Segment([(fill(rng.choice(says), said, rng), fill(rng.choice(W.CHAT_REPLIES), said, rng))],
                               {0: tag}, sessions))
        asked = mention(person, rng.choice(("name", "nick", "rel")))
        self.pending.append(Pending("multi", fill(rng.choice(asks), asked, rng), ", ".join(items), tags))

    def update_thread(self) -> None:
        """A state that changes two or three times; the question asks for the latest."""
        rng = self.rng
        name, says, asks, pool = rng.choice(W.UPDATES)
        person = self.person(lambda p: self.bench.free((name, p.name)))
        if person is None:
            return
        self.bench.take((name, person.name))
        states = rng.sample(pool, rng.randint(2, 3))
        tag = ""
        for state, sessions in zip(states, _split(list(range(SESSIONS)), len(states)), strict=True):
            said = {"value": state} | mention(person, rng.choice(("name", "nick", "rel")))
            tag = self.tag()
            self.place(Segment([(fill(rng.choice(says), said, rng), fill(rng.choice(W.CHAT_REPLIES), said, rng))],
                               {0: tag}, sessions))
        asked = mention(person, rng.choice(("name", "nick", "rel")))
        self.pending.append(Pending("update", fill(rng.choice(asks), asked, rng), states[-1], [tag]))

    def chain(self) -> None:
        """A pet's kind said with its owner, its name in another session: "what kind of animal is Pickle?"."""
        rng = self.rng
        kind = next(k for k in W.KINDS if k.name == "adopt_pet")
        person = self.person(lambda p: kind.fits(p.relation) and self.bench.free(_key(kind, p, {})))
        if person is None:
            return
        values = {k: rng.choice(v) for k, v in kind.slots.items()}
        if not self.bench.free(("petname", values["petname"])):
            return
        self.bench.take(_key(kind, person, values))
        self.bench.take(("petname", values["petname"]))
        first = values | mention(person, rng.choice(("name", "nick", "rel")))
        second = values | mention(person, rng.choice(("name", "nick", "rel")))
        half = SESSIONS // 2
        a, b = self.tag(), self.tag()
        self.place(Segment([(fill(rng.choice(CHAIN_FIRST), first, rng), self.reply(kind, first))], {0: a},
                           range(half)))
        self.place(Segment([(fill(rng.choice(CHAIN_SECOND), second, rng),
                             fill(rng.choice(W.CHAT_REPLIES), second, rng))], {0: b}, range(half, SESSIONS)))
        self.pending.append(Pending("multi", fill(rng.choice(CHAIN_ASK), values, rng), values["animal"], [a, b]))

    # ------------------------------------------------------------ time

    def anchored(self) -> None:
        """An event whose day is said ("Mags's wedding is on Saturday") and something done in the week
        before or after it: both turns are evidence."""
        rng = self.rng
        name, says, phrase = rng.choice(W.ANCHORS)
        person = self.person(lambda p: p.relation in W.ADULTS and self.bench.free(("anchor", name, p.name)))
        kinds = [k for k in W.KINDS if k.around]
        if person is None:
            return
        for _ in range(50):
            s = rng.randrange(2, SESSIONS - 2)
            day = self.dates[s] + timedelta(days=rng.randint(2, 6))
            before = rng.random() < 0.5
            lo, hi = (day - timedelta(days=7), day - timedelta(days=1)) if before else \
                (day + timedelta(days=1), day + timedelta(days=7))
            near = [t for t in range(SESSIONS) if t != s and lo <= self.dates[t] <= hi]
            kind = rng.choice(kinds)
            if near and not self.crowded(kind.name, lo, hi):
                break
        else:
            return
        self.bench.take(("anchor", name, person.name))
        values = {"weekday": calendar.day_name[day.weekday()]} | mention(person, rng.choice(("name", "nick", "rel")))
        a = self.tag()
        self.place(Segment([(fill(rng.choice(says), values, rng), fill(rng.choice(W.CHAT_REPLIES), values, rng))],
                           {0: a}, [s]))
        target = self.target(kind, near)
        if target is None:
            return
        rel = ("the week before " if before else "in the days after ") + \
            fill(phrase, mention(person, rng.choice(("name", "nick", "rel"))), rng)
        answer, b = target
        self.pending.append(Pending("temporal", fill(rng.choice(kind.around), {"rel": rel}, rng), answer, [a, b]))

    def period(self) -> None:
        """Something done in a month: "what did I cook in March 2023?"."""
        rng = self.rng
        kind = rng.choice([k for k in W.KINDS if k.around])
        month = _add_months(self.start, rng.randrange(6))
        end = _add_months(month, 1)
        sessions = [s for s in range(SESSIONS) if month <= self.dates[s] < end]
        if not sessions or self.crowded(kind.name, month - timedelta(days=4), end + timedelta(days=4)):
            return
        target = self.target(kind, sessions)
        if target is None:
            return
        said = calendar.month_name[month.month] + (f" {month.year}" if rng.random() < 0.5 else "")
        answer, tag = target
        self.pending.append(Pending("temporal", fill(rng.choice(kind.around), {"rel": f"in {said}"}, rng), answer,
                                    [tag], (month.timestamp(), end.timestamp())))

    def crowded(self, kind: str, lo: datetime, hi: datetime) -> bool:
        return any(lo - timedelta(days=7) <= d <= hi + timedelta(days=7) for d in self.kind_days.get(kind, []))

    def target(self, kind: Kind_, sessions: Sequence[int]) -> tuple[str, str] | None:
        rng = self.rng
        for _ in range(50):
            values = {k: rng.choice(v) for k, v in kind.slots.items()}
            person = self.person(lambda p, v=values: kind.fits(p.relation) and self.bench.free(_key(kind, p, v)))
            if person is not None:
                break
        else:
            return None
        self.bench.take(_key(kind, person, values))
        said = values | mention(person, rng.choice(("name", "nick", "rel")))
        tag = self.tag()
        s = self.place(Segment([(fill(rng.choice(kind.say), said, rng), self.reply(kind, said))], {0: tag}, sessions))
        self.kind_days.setdefault(kind.name, []).append(self.dates[s])
        return _answer(kind, person, said, rng), tag

    # ------------------------------------------------------------ chit-chat and layout

    def chat(self, s: int) -> Row:
        rng = self.rng
        person = rng.choice(CAST)
        values = mention(person, rng.choice(("name", "nick", "rel"))) | {"name": person.nick}
        roll = rng.random()
        if roll < REQUEST_SHARE:
            ask, answer = rng.choice(W.REQUESTS)
            return fill(ask, values, rng), fill(answer, values, rng)
        earlier = [x for x in self.said if x[0] < s]
        if earlier and rng.random() < ECHO_SHARE:
            _, kind, said = rng.choice(earlier)
            if kind.reply:
                user = fill(rng.choice(W.DAY), values, rng)
                return user, fill(rng.choice(ECHOES), said, rng) + " " + fill(rng.choice(kind.reply), said, rng)
        opener, day = rng.choice(W.OPENERS), fill(rng.choice(W.DAY), values, rng)
        parts = [opener + (day[0].lower() + day[1:] if opener and day[1:2].islower() else day)] \
            if rng.random() < 0.6 else []
        if rng.random() < NAMED_CHAT:
            parts.append(fill(rng.choice(W.ACTIVITY), values, rng))
        if rng.random() < 0.5 or not parts:
            parts.append(fill(rng.choice([m for m in W.MUSING if "{" not in m]), values, rng))
        reply = fill(rng.choice(W.CHAT_REPLIES), values, rng)
        if rng.random() < 0.4:
            reply += " " + fill(rng.choice(W.CHAT_REPLIES), values, rng)
        return fill(" ".join(parts), values, rng), reply

    def layout(self) -> tuple[list[Turn], dict[str, tuple[str, int]]]:
        rng = self.rng
        turns, where = [], {}
        for s in range(SESSIONS):
            session = f"d{self.c}-s{s:02d}"
            segments = list(self.placed[s])
            rng.shuffle(segments)
            chat = max(0, self.sizes[s] - sum(len(seg.rows) for seg in segments))
            # Chit-chat between the facts: each segment gets a random share of it before it.
            cuts = sorted(rng.randint(0, chat) for _ in segments)
            rows: list[tuple[Row, str | None]] = []
            last = 0
            for cut, seg in zip(cuts, segments, strict=True):
                rows += [(self.chat(s), None) for _ in range(cut - last)]
                last = cut
                rows += [(row, seg.tags.get(i)) for i, row in enumerate(seg.rows)]
            rows += [(self.chat(s), None) for _ in range(chat - last)]
            at = self.dates[s]
            for t, ((user, assistant), tag) in enumerate(rows, 1):
                turns.append(Turn(session, t, at.timestamp(), user, assistant))
                at += timedelta(seconds=rng.randint(60, 300))
                if tag is not None:
                    where[tag] = (session, t)
        return turns, where

    def build(self) -> tuple[list[Turn], list[Question]]:
        for _ in range(FACTS):
            self.fact()
        for make, n in ((self.list_thread, LISTS), (self.update_thread, UPDATES), (self.chain, CHAINS),
                        (self.anchored, ANCHORS), (self.period, PERIODS)):
            for _ in range(n):
                make()
        turns, where = self.layout()
        questions = [Question(id=f"d{self.c}-q{i:03d}", conversation=self.c, category=p.category, question=p.question,
                              asked_at=self.asked.timestamp(), answer=p.answer,
                              evidence=sorted({where[t] for t in p.tags}), window=p.window)
                     for i, p in enumerate(self.pending)]
        return turns, questions


Kind_ = W.Kind

LEADS = ("{P} rang me {this morning|earlier|last night}.", "Had a long chat with {p} {today|over lunch}.",
         "{P} came round for a cuppa.", "Got a voice note from {p}.", "Caught up with {p} {today|at the weekend}.")
LEAD_REPLIES = ("Oh nice, how is {sub}?", "What did {sub} have to say?", "Lovely. Any news?",
                "How's {sub} doing?")
ECHOES = ("By the way, how are things?", "Oh, that reminds me.", "Hope the week gets better.", "")
CHAIN_FIRST = ("{P} adopted a {animal} from the rescue centre.", "{P} has a new pet, a {animal}.",
               "{P} brought a {animal} home from the shelter.")
CHAIN_SECOND = ("Looked after {petname} for {p} {today|this weekend}, exhausting.",
                "{petname} chewed {ps} shoes again, {sub} was furious.",
                "{P} sent me photos of {petname} asleep on the sofa.")
CHAIN_ASK = ("What kind of animal is {petname}?", "What sort of pet is {petname}?")


def _key(kind: Kind_, person: Person, values: dict[str, str]) -> tuple[str, ...]:
    """What makes a fact's question unambiguous across the whole benchmark."""
    group = {"move": "home", "new_job": "job"}.get(kind.name, kind.name)
    return (group, *((person.name if c == "person" else values.get(c, "*")) for c in kind.cues))


def _answer(kind: Kind_, person: Person, values: dict[str, str], rng: random.Random) -> str:
    return person.name if kind.answer == "person" else fill("{" + kind.answer + "}", values, rng)


def _split(items: list[int], n: int) -> list[list[int]]:
    return [items[i * len(items) // n:(i + 1) * len(items) // n] for i in range(n)]


def _add_months(when: datetime, n: int) -> datetime:
    month = when.month - 1 + n
    return when.replace(year=when.year + month // 12, month=month % 12 + 1, day=1)


class _Bench:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.used: set[tuple[str, ...]] = set()

    def free(self, key: tuple[str, ...]) -> bool:
        if "*" in key:  # any value of that cue: is any fact of this kind about this person taken?
            return not any(len(u) == len(key) and all(k in ("*", v) for k, v in zip(key, u, strict=True))
                           for u in self.used)
        return key not in self.used

    def take(self, key: tuple[str, ...]) -> None:
        self.used.add(key)


def benchmark(seed: int = 11, eras: int = ERAS) -> tuple[list[Turn], list[Question]]:
    bench = _Bench(seed)
    turns, questions = [], []
    for c in range(eras):
        t, q = _Era(bench, c).build()
        turns += t
        questions += q
    return turns, questions


def unrelated(seed: int = 11) -> list[str]:
    """Messages that ask nothing of memory: auto-recall should send them alone."""
    return list(W.UNRELATED)


def write(out: Path, seed: int) -> None:
    generate.write(out, *benchmark(seed), unrelated=[{"message": m} for m in unrelated(seed)])


if __name__ == "__main__":
    generate.main(__doc__, write, seed=11)
