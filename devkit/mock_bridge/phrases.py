"""The plain phrases the demo model and the demo curator understand, from one table of topics.

A topic knows how a person states it ("my name is Dana"), how they ask for it ("what is my
name?"), its line in user.md (`- Name: Dana`), its learning ("The user's name is Dana.") and
the answer ("Your name is Dana."). Pure functions over text: a demo must be predictable,
so nothing here guesses beyond these patterns.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

# Words a clause may start with before what it states or asks: "Hi, so my name is Dana".
_LEAD = r"(?:(?:hi|hello|hey|oh|ok|okay|well|so|also|and|but|actually|btw|by the way)\b[\s,!]*)*"
_NEVER = r"(?!)"


@dataclass(frozen=True)
class Topic:
    key: str  # the label of its user.md line; "" when the person names it ("my <key> is ...")
    said: re.Pattern[str] = field(repr=False)
    asked: re.Pattern[str] = field(repr=False)
    kind: Literal["FACT", "PREFERENCE"]
    learning: str  # third person, with {key} and {value}
    answer: str  # second person, with {key} and {value}
    many: bool = False  # keeps every value (likes); otherwise a new value replaces the old one


def _topic(key: str, said: str, asked: str, kind: Literal["FACT", "PREFERENCE"], learning: str,
           answer: str, many: bool = False) -> Topic:
    def compile_(pattern: str) -> re.Pattern[str]:
        return re.compile(rf"{_LEAD}(?:{pattern})", re.IGNORECASE)

    return Topic(key, compile_(said), compile_(asked), kind, learning, answer, many)


TOPICS: tuple[Topic, ...] = (
    _topic("Name", r"(?:my name is|my name's|call me|i am called|i'm called)\s+(?P<value>.+)",
           r"what(?:'s| is) my name|who am i|do you know my name|do you know who i am",
           "FACT", "The user's name is {value}.", "Your name is {value}."),
    _topic("Lives in", r"i(?: live|'m living| am living|'m based| am based) in\s+(?P<value>.+)",
           r"where do i live|where am i based|where(?:'s| is) my home",
           "FACT", "The user lives in {value}.", "You live in {value}."),
    _topic("From", r"i(?: am|'m| come) from\s+(?P<value>.+)", r"where am i from|where do i come from",
           "FACT", "The user is from {value}.", "You are from {value}."),
    _topic("Works as", r"i work as\s+(?P<value>.+)", r"what do i do(?: for a living)?|what do i work as",
           "FACT", "The user works as {value}.", "You work as {value}."),
    _topic("Works at", r"i work (?:at|for)\s+(?P<value>.+)", r"where do i work|who do i work for",
           "FACT", "The user works at {value}.", "You work at {value}."),
    _topic("Prefers", r"i(?: really| much)? prefer\s+(?P<value>.+)", r"what do i prefer|what are my preferences",
           "PREFERENCE", "The user prefers {value}.", "You prefer {value}.", many=True),
    _topic("Dislikes", r"i(?: really)? (?:don't like|do not like|dislike|hate)\s+(?P<value>.+)",
           r"what do i (?:dislike|hate|not like)|what don't i like",
           "PREFERENCE", "The user does not like {value}.", "You don't like {value}.", many=True),
    _topic("Likes", r"i(?: really)? (?:like|love|enjoy)\s+(?P<value>.+)", r"what do i (?:like|love|enjoy)",
           "PREFERENCE", "The user likes {value}.", "You like {value}.", many=True),
    _topic("Note", r"(?:please\s+)?remember(?: that)?\s+(?P<value>.+)", _NEVER,
           "FACT", "{value}.", "{value}.", many=True),
    # Last: any "my <something> is <value>" the topics above did not claim.
    _topic("", r"my (?P<key>[a-z][\w' -]{0,38}?) (?:is|are)\s+(?P<value>.+)",
           r"what(?:'s| is| are) my (?P<key>[\w' -]{1,40})",
           "FACT", "The user's {key} is {value}.", "Your {key} is {value}."),
)
BY_KEY = {t.key.lower(): t for t in TOPICS if t.key}
ANY_KEY = TOPICS[-1]


@dataclass(frozen=True)
class Statement:
    """One thing a person said about themselves: `key` is its user.md label, `value` third person."""

    topic: Topic
    key: str
    value: str

    @property
    def learning(self) -> str:
        return _capital(self.topic.learning.format(key=self.key.lower(), value=self.value))


def topic_of(key: str) -> Topic:
    return BY_KEY.get(key.lower(), ANY_KEY)


# ---------------------------------------------------------------- statements

_SENTENCE = re.compile(r"[^.!?\n;]+[.!?]*")
# Where one sentence holds two statements: "My name is Dana, and I live in Lisbon".
_JOIN = re.compile(r"(?:\s*,\s*(?:(?:and|but)\s+)?|\s+(?:and|but)\s+)(?=(?:i|i'm|my|please remember|remember)\b)",
                   re.IGNORECASE)
MAX_VALUE_CHARS = 100


def statements(text: str) -> list[Statement]:
    """What `text` states about the person, in order. Questions state nothing."""
    found: list[Statement] = []
    for sentence in _SENTENCE.findall(text):
        if sentence.rstrip().endswith("?"):
            continue
        for clause in _JOIN.split(sentence.strip(" \t.!")):
            if (statement := _statement(clause.strip())) is not None:
                found.append(statement)
    return found


def _statement(clause: str) -> Statement | None:
    for topic in TOPICS:
        if (m := topic.said.fullmatch(clause)) is None:
            continue
        value = third_person(_clean(m["value"]))
        key = topic.key or _capital(_clean(m["key"]))
        if not value or len(value) > MAX_VALUE_CHARS:
            return None
        return Statement(topic, key, value)
    return None


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


def _clean(text: str) -> str:
    return text.strip().strip("\"'`“”‘’").rstrip(" .,!;:").strip()


# Whole words, longest first: "I am" before "I".
_THIRD = (("i am", "the user is"), ("i'm", "the user is"), ("i have", "the user has"), ("i've", "the user has"),
          ("myself", "the user"), ("mine", "the user's"), ("my", "the user's"), ("me", "the user"),
          ("i", "the user"))
_SECOND = (("the user is", "you are"), ("the user has", "you have"), ("the user's", "your"), ("the user", "you"))


def _swap(text: str, pairs: tuple[tuple[str, str], ...]) -> str:
    table = dict(pairs)
    pattern = re.compile(r"\b(?:" + "|".join(re.escape(a) for a, _ in pairs) + r")\b(?!')", re.IGNORECASE)
    return pattern.sub(lambda m: table[m[0].lower()], text)


def third_person(text: str) -> str:
    """"my sister is Ana" -> "the user's sister is Ana": what the curator writes down."""
    return _swap(text, _THIRD)


def second_person(text: str) -> str:
    """"the user's sister is Ana" -> "your sister is Ana": how the model says it back."""
    return _swap(text, _SECOND)


# ---------------------------------------------------------------- questions


@dataclass(frozen=True)
class AboutMe:
    """"What do you know about me?": everything the boot prompt holds about the person."""


@dataclass(frozen=True)
class AboutTopic:
    """"What is my name?": one user.md line."""

    topic: Topic
    key: str


@dataclass(frozen=True)
class Recall:
    """"What do you remember about tea?": a memory search."""

    query: str


Question = AboutMe | AboutTopic | Recall

_RECALL = re.compile(rf"{_LEAD}(?:what do you (?:remember|know|recall) about|do you remember)\s+(?P<query>.+)",
                     re.IGNORECASE)
_ME = {"me", "myself", "who i am"}


def question(text: str) -> Question | None:
    """What `text` asks about the person or their memory, or None if it asks none of that."""
    text = text.strip().rstrip(" ?!.").strip()
    if (m := _RECALL.fullmatch(text)) is not None:
        query = _clean(m["query"])
        return AboutMe() if query.lower() in _ME else Recall(query)
    for topic in TOPICS:
        if (m := topic.asked.fullmatch(text)) is not None:
            key = topic.key or _clean(m["key"])
            return AboutTopic(topic_of(key), key)
    return None


def answer(topic: Topic, key: str, values: list[str]) -> str:
    """The topic's answer, in the second person: "You like tea and jazz." """
    value = values[0] if len(values) == 1 else ", ".join(values[:-1]) + " and " + values[-1]
    return _capital(second_person(topic.answer.format(key=key.lower(), value=value)))
