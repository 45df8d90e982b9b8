"""The demo curator: what the mock Bridge's curator side answers in dev mode when nothing is scripted.

It reads the curator prompt the daemon built (the current files, then the observed turns),
picks out what the person plainly stated about themselves ("my name is Dana", "I live in
Lisbon", "I prefer tea", "remember that ..."; see `phrases`), and replies in the curator's
format: one learning per new statement, then USER_MD_UPDATE with the whole new user.md,
merged with the current one. A statement that changes a known single value ("my name is
Daniela" after "Dana") replaces it and is a CORRECTION. For each session the prompt says
ended, one SUMMARY line naming what the person last said. Nothing new: `NONE`.
"""

from __future__ import annotations

import re

from sprite_os.memory.curation.curator import SESSIONS_ENDED

from .phrases import statements
from .profile import USER_MD, Profile
from .request import RecordedRequest, message_text

PROMPT_START = "Current memory files:"
_OBSERVATION = re.compile(
    r"^\[#(?P<id>\d+)\] \d{4}-\d\d-\d\d \d\d:\d\d UTC\nUSER: (?P<said>.*?)\n(?=TOOL |AGENT: |\(\d+ more tool calls\))",
    re.MULTILINE | re.DOTALL)
_ENDED_TURN = re.compile(r"#(\d+)")


def reply(request: RecordedRequest) -> str:
    """The `CuratorScript.default` of dev mode."""
    prompts = [text for m in request.messages if PROMPT_START in (text := message_text(m))]
    return curate(prompts[0]) if prompts else "NONE"


def curate(prompt: str) -> str:
    """The reply to one curator prompt (built by `sprite_os.memory.curation.curator.build_prompt`)."""
    profile = Profile(file_in_prompt(prompt, USER_MD.name))
    learnings: list[str] = []
    for match in _OBSERVATION.finditer(prompt):
        for said in statements(match["said"]):
            known = profile.values(said.key)
            if said.value.lower() in (v.lower() for v in known):
                continue  # the file already says it
            if known and not said.topic.many:
                profile.replace(said.key, said.value)
                learnings.append(f"CORRECTION: {said.learning.rstrip('.')}, not {known[0]}. [#{match['id']}]")
            else:
                profile.add(said.key, said.value)
                learnings.append(f"{said.topic.kind}: {said.learning} [#{match['id']}]")
    said_by_turn = {int(m["id"]): m["said"] for m in _OBSERVATION.finditer(prompt)}
    summaries = [summary(said_by_turn, int(n), len(learnings)) for n in _ENDED_TURN.findall(_ended_line(prompt))]
    if not learnings:
        return "\n".join(summaries) or "NONE"
    return "\n".join([*learnings, *summaries, "USER_MD_UPDATE:", profile.text()])


def _ended_line(prompt: str) -> str:
    return next((line for line in prompt.splitlines() if line.startswith(SESSIONS_ENDED)), "")


def summary(said: dict[int, str], last_turn: int, noted: int) -> str:
    """One line about a session that ended with turn #`last_turn`."""
    last = " ".join(said.get(last_turn, "").split())
    last = last if len(last) <= 80 else last[:79] + "…"
    return (f"SUMMARY: A session of conversation that ended with the person saying \"{last}\"; "
            f"{noted} new thing{'' if noted == 1 else 's'} noted. [#{last_turn}]")


def file_in_prompt(prompt: str, name: str) -> str:
    """A memory file's text as the prompt shows it ("" for "(empty)")."""
    m = re.search(rf"^===== {re.escape(name)} \([^\n]*\) =====\n(?P<text>.*?)(?=\n\n===== |\n\nPending actions|"
                  r"\n\nObservations: )", prompt, re.MULTILINE | re.DOTALL)
    text = m["text"] if m else ""
    return "" if text.strip() == "(empty)" else text
