"""The curator's contract: what one stateless model call is given, within which limits.

Pure functions, no I/O: the system prompt, the rendering of turns, the batch's size limits
(characters and tokens, in one place), and the follow-up that asks for a shorter reply. How
the reply is read is memory/curation/reply.py.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Protocol

from ...errors import ConfigError
from ...text import CHARS_PER_TOKEN, estimate_tokens, utc
from ..files import MAX_FILE_BYTES, SPECS
from ..memory_store import PendingAction
from ..transcript_store import Observation
from .reply import MAX_LEARNING_CHARS

OBSERVATION_CHARS = 8_000  # one turn's share of the prompt, at most
BATCH_CHARS = 60_000  # observations per call; a bigger batch is split (see turn_chars)
PROMPT_ACTIONS = 50  # open actions shown to the curator, newest first, so it can close them
ACTION_CHARS = 300
TURN_TEXT_CHARS = 3_000  # the person's message, and the answer, each
TOOL_CALLS_SHOWN = 12
TOOL_CALL_CHARS = 300  # a tool call's input, and its output, each
SESSIONS_ENDED = "Sessions that ended (by their last turn):"
SUMMARIES_PER_CALL = 8  # sessions summarised by one call, at most

SYSTEM = f"""You are the memory curator of a personal AI agent that works for one person on their own \
computer. You never talk to the person. You read what happened in recent turns and keep the agent's \
memory accurate, short and current. The agent reads these files at the start of every session.

Reply in exactly this format and nothing else:
- First, one line per NEW learning, each starting with its type:
  FACT: <a durable fact about the person, their work, or their files>
  PREFERENCE: <how the person likes things done>
  CORRECTION: <something earlier memory got wrong, and what is right>
  PATTERN: <a recurring behaviour or workflow>
  ACTION: <something the agent should follow up on>
  TOOL_INSTALL: <a tool, command or capability that became available>
  SUMMARY: <one line per session the input says ended: what was done, what was decided, what is still open>
  You may end a learning with [#N], the number of the turn it comes from (for a SUMMARY, the session's last turn).
  DONE: A<id>  (a pending action, listed in the input, that the turns show is done or no longer wanted)
  If nothing is worth remembering, reply with the single line NONE.
- Then, for each file that needs to change, a line with only its marker, followed by the COMPLETE new \
file (not a diff):
  TOOLS_MD_UPDATE:  (tools.md, at most {SPECS['tools.md'].max_lines} lines: learned procedures, capabilities)
  FILES_MD_UPDATE:  (files.md, at most {SPECS['files.md'].max_lines} lines: what is where in the person's files)
  USER_MD_UPDATE:  (user.md, at most {SPECS['user.md'].max_lines} lines: who the person is, preferences, history)
  CONTEXT_MD_UPDATE:  (context.md, at most {SPECS['context.md'].max_lines} lines: active tasks, decisions, reminders)
  Omit a file that needs no change. Never write soul.md or os.md.

Rules:
- Extract NEW learnings only: skip what the files or earlier learnings already say.
- When updating a file, output the complete file and stay under its line limit.
- Prioritise: recent corrections > active tasks > active preferences > key facts > historical context.
- Remove contradicted or completed information. When the person corrects something, the old statement \
must disappear from every file and a CORRECTION learning must be emitted.
- Never record secrets (passwords, keys, tokens) or text the person marked private.
- Write plain markdown; never put a marker line inside a file."""


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f" …[{len(text) - limit} more characters]"


class Turn(Protocol):
    """A recorded turn (Observation), or one still on its way to transcript.db (NewObservation)."""

    @property
    def timestamp(self) -> float: ...
    @property
    def user_message(self) -> str: ...
    @property
    def tool_calls_json(self) -> str: ...
    @property
    def agent_response(self) -> str: ...


def render_turn(turn: Turn, header: str, text_chars: int, calls_shown: int, call_chars: int) -> str:
    """One turn for a model to read, as the curator and the boot prompt show it: the person's
    message and the answer (each cut at `text_chars`), and the first `calls_shown` tool calls."""
    lines = [header, f"USER: {_cut(turn.user_message, text_chars)}"]
    try:
        calls = json.loads(turn.tool_calls_json)
    except ValueError:
        calls = []
    for call in calls[:calls_shown]:
        status = "error" if call.get("is_error") else "ok"
        lines.append(f"TOOL {call.get('name', '?')} {_cut(str(call.get('input', '')), call_chars)} -> {status}: "
                     f"{_cut(str(call.get('output', '')), call_chars)}")
    if len(calls) > calls_shown:
        lines.append(f"({len(calls) - calls_shown} more tool calls)")
    lines.append(f"AGENT: {_cut(turn.agent_response, text_chars)}")
    return "\n".join(lines)


def render_observation(obs: Observation) -> str:
    """One turn, bounded: long messages and tool output are cut."""
    when = utc(obs.timestamp, "%Y-%m-%d %H:%M UTC")
    return _cut(render_turn(obs, f"[#{obs.id}] {when}", TURN_TEXT_CHARS, TOOL_CALLS_SHOWN, TOOL_CALL_CHARS),
                OBSERVATION_CHARS)


def split_batch(observations: list[Observation], budget: int = BATCH_CHARS) -> list[list[Observation]]:
    """Consecutive chunks whose rendered size fits one call."""
    chunks: list[list[Observation]] = []
    current: list[Observation] = []
    size = 0
    for obs in observations:
        n = len(render_observation(obs))
        if current and size + n > budget:
            chunks.append(current)
            current, size = [], 0
        current.append(obs)
        size += n
    if current:
        chunks.append(current)
    return chunks


def _context(files: dict[str, str], actions: list[PendingAction] | None) -> list[str]:
    """The prompt before the turns."""
    parts = ["Current memory files:"]
    for name, spec in SPECS.items():
        role = "deploy-managed, read-only" if spec.owner == "deploy" else f"curated, at most {spec.max_lines} lines"
        parts.append(f"===== {name} ({role}) =====\n{files.get(name, '').strip() or '(empty)'}")
    if actions:
        parts.append("Pending actions (close one with DONE: A<id>):\n"
                     + "\n".join(f"[A{a.id}] {_cut(a.content, ACTION_CHARS)}" for a in actions))
    return parts


def build_prompt(files: dict[str, str], observations: list[Observation],
                 actions: list[PendingAction] | None = None, ended: Collection[str] = ()) -> str:
    """`ended`: the sessions among these turns that have ended, each to be summarised in one line."""
    parts = _context(files, actions)
    first, last = observations[0].id, observations[-1].id
    parts.append(f"Observations: turns #{first} to #{last}, oldest first.")
    parts.extend(render_observation(obs) for obs in observations)
    if note := ended_note(observations, ended):
        parts.append(note)
    parts.append("Extract new learnings and update the files that need it, in the format described.")
    return "\n\n".join(parts)


def ended_note(observations: list[Observation], ended: Collection[str]) -> str:
    """Which sessions ended with these turns, each by its last turn, and what to write about it."""
    last = {o.session_id: o.id for o in observations if o.session_id in ended}
    if not last:
        return ""
    turns = sorted(last.values())[-SUMMARIES_PER_CALL:]  # bounded: the frame around the turns is budgeted
    return (f"{SESSIONS_ENDED} " + ", ".join(f"#{n}" for n in turns)
            + ". Write one SUMMARY line for each, ending with [#N], its last turn.")


# ---------------------------------------------------------------- the size of a call
#
# Two limits bound what one call is given, and this is where they meet:
# - characters: a turn renders to at most OBSERVATION_CHARS (TURN_MAX_CHARS with the cut's note),
#   and the turns of one call to at most BATCH_CHARS;
# - tokens: the whole input (system prompt, the six files, the open actions: the fixed part,
#   then the turns) is estimated at CHARS_PER_TOKEN and must stay within the per-call cap,
#   SPRITE_MEMORY_BATCH_TOKENS. The turns get what the fixed part leaves of the cap, BATCH_CHARS
#   at most (turn_chars), and a batch is split into chunks of that size.
# The cap must leave room for one turn beside the largest fixed part (every file at
# MAX_FILE_BYTES, PROMPT_ACTIONS long actions): MIN_BATCH_TOKENS. The default leaves room for
# BATCH_CHARS of turns beside it, so a full 25-turn batch is never split for tokens (measured:
# ~224,000 characters, ~56,000 tokens; files at their line limits, ~94 KB, make it ~43,000).

TURN_MAX_CHARS = OBSERVATION_CHARS + 50  # the cut adds a note of its own
TURNS_FRAME = 400  # the lines before and after the turns, and the blank lines between them


def fixed_chars(files: dict[str, str], actions: list[PendingAction] | None) -> int:
    """The input's characters besides the turns."""
    return len(SYSTEM) + len("\n\n".join(_context(files, actions))) + TURNS_FRAME


def turn_chars(batch_tokens: int, fixed: int) -> int:
    """Characters of turns one call may carry under the token cap (split_batch's budget). Below
    one turn only when the files are over their limits: a chunk still holds one turn."""
    return min(BATCH_CHARS, batch_tokens * CHARS_PER_TOKEN - fixed)


FIXED_MAX_CHARS = fixed_chars(
    {name: "x" * MAX_FILE_BYTES for name in SPECS},
    [PendingAction(10**9, 0.0, "x" * MAX_LEARNING_CHARS, 0, "pending", None)] * PROMPT_ACTIONS)
MIN_BATCH_TOKENS = estimate_tokens(FIXED_MAX_CHARS + TURN_MAX_CHARS)
# config.DEFAULT_BATCH_TOKENS (the setting's default) is >= estimate_tokens(FIXED_MAX_CHARS + BATCH_CHARS), tested.


def check_batch_tokens(tokens: int) -> None:
    """SPRITE_MEMORY_BATCH_TOKENS must leave room for one turn beside the largest fixed part."""
    if tokens < MIN_BATCH_TOKENS:
        raise ConfigError(f"SPRITE_MEMORY_BATCH_TOKENS must be at least {MIN_BATCH_TOKENS} (the largest prompt "
                          f"without turns, plus one turn), got {tokens}")


TRUNCATED = "your reply was cut off at the token limit"


def shorten_request(problems: list[str]) -> str:
    return ("Your reply broke these limits: " + "; ".join(problems) + ". Reply again in the same format, "
            "with every file you rewrite under its line limit: drop the least important lines.")


# ---------------------------------------------------------------- parsing
