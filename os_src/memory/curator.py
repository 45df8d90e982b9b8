"""The curator's contract: what one stateless model call is given, and how its reply is read.

Pure functions, no I/O. The reply format is the seed's: learning lines
(`FACT: ...`), or `NONE`, then `<NAME>_MD_UPDATE:` blocks that each hold a whole
file. Parsing is deliberately strict about structure and forgiving about
decoration: a marker starts its line (a label after it that names its file, like
`(user.md)`, is ignored; any other text after it, like `(no changes needed)`, means
the line opens no block); a line inside a file block is file content even if it
starts with `FACT:`, and so is a marker-shaped line inside a ``` code block opened
in that block, but any other marker-shaped line ends the block, and the block of an
unknown or forbidden marker (`SOUL_MD_UPDATE`) is dropped; a ``` fence wrapping the
whole reply is ignored; anything unrecognised is reported, never guessed at. Control
characters and lone surrogates are taken out before anything is read (text.safe_text).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Protocol

from ..text import safe_text
from .files import CURATED, MAX_FILE_BYTES, SPECS
from .memory_store import LEARNING_TYPES, NewLearning, PendingAction
from .transcript_store import Observation

OBSERVATION_CHARS = 8_000  # one turn's share of the prompt, at most
BATCH_CHARS = 60_000  # observations per call; a bigger batch is split (see turn_chars)
PROMPT_ACTIONS = 50  # open actions shown to the curator, newest first, so it can close them
ACTION_CHARS = 300
TURN_TEXT_CHARS = 3_000  # the person's message, and the answer, each
TOOL_CALLS_SHOWN = 12
TOOL_CALL_CHARS = 300  # a tool call's input, and its output, each
MAX_LEARNING_CHARS = 600
MAX_LEARNINGS = 60

CONFIDENCE = {"CORRECTION": 0.95, "PREFERENCE": 0.85, "TOOL_INSTALL": 0.9, "FACT": 0.8, "ACTION": 0.8,
              "PATTERN": 0.7, "SUMMARY": 0.9}

MARKERS = {f"{name.split('.')[0].upper()}_MD_UPDATE": name for name in CURATED}
SESSIONS_ENDED = "Sessions that ended (by their last turn):"
MAX_SUMMARIES = 8  # sessions summarised by one call, at most

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
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(obs.timestamp))
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
    turns = sorted(last.values())[-MAX_SUMMARIES:]  # bounded: the frame around the turns is budgeted
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
# 223,400 characters, ~55,900 tokens; files at their line limits, ~94 KB, make it ~43,000).

CHARS_PER_TOKEN = 4  # English prose; denser text costs more tokens, and the proxy's usage is what is billed
TURN_MAX_CHARS = OBSERVATION_CHARS + 50  # the cut adds a note of its own
TURNS_FRAME = 400  # the lines before and after the turns, and the blank lines between them


def estimate_tokens(chars: int) -> int:
    return -(-chars // CHARS_PER_TOKEN)


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
DEFAULT_BATCH_TOKENS = 60_000  # >= estimate_tokens(FIXED_MAX_CHARS + BATCH_CHARS), tested


TRUNCATED = "your reply was cut off at the token limit"


def shorten_request(problems: list[str]) -> str:
    return ("Your reply broke these limits: " + "; ".join(problems) + ". Reply again in the same format, "
            "with every file you rewrite under its line limit: drop the least important lines.")


# ---------------------------------------------------------------- parsing

# Any line that starts like a marker is one, known or not: a forbidden SOUL_MD_UPDATE inside a
# user.md block must end that block, not become user.md content (unless it sits in a code block
# of that file). Text after the colon is kept apart (group 2), never taken as file content.
_MARKER = re.compile(r"^\s*(?:#+\s*)?[*`]*\s*([A-Z]+_MD_UPDATE)\b[*`]*\s*:?[*`]*\s*(.*?)\s*$")
_LEARNING = re.compile(r"^\s*(?:[-*]\s+)?\**\s*([A-Za-z_]+)\s*\**\s*:\s*(.+?)\s*$")
_REF = re.compile(r"\s*\[#(\d+)\]\s*$")
_DONE = re.compile(r"^\s*(?:[-*]\s+)?\**\s*DONE\s*\**\s*:\s*\[?A?(\d+)\]?", re.IGNORECASE)
_FENCE = re.compile(r"^\s*```")


@dataclass
class CuratorReply:
    learnings: list[NewLearning] = field(default_factory=list)
    file_updates: dict[str, str] = field(default_factory=dict)
    said_none: bool = False
    done_actions: list[int] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)  # lines that fit no rule
    rejected_files: list[str] = field(default_factory=list)  # blocks dropped as ambiguous or empty
    declined_files: list[str] = field(default_factory=list)  # `USER_MD_UPDATE: (no changes needed)`

    @property
    def recognised(self) -> bool:
        """False for garbage or an empty reply: nothing in it follows the format."""
        return (self.said_none or bool(self.learnings) or bool(self.file_updates) or bool(self.rejected_files)
                or bool(self.done_actions) or bool(self.declined_files))


def parse_reply(text: str, observation_ids: list[int], session_of: dict[int, str] | None = None,
                truncated: bool = False) -> CuratorReply:
    """Read a reply. `truncated`: the model hit its token limit, so whatever came last (a file
    block or a learning line) is incomplete and is dropped, never applied. The reply is made plain
    text first (text.safe_text: no NUL or other control character, valid UTF-8), whatever the
    model sent: it becomes files and learnings, and from them the boot prompt."""
    text = safe_text(text)
    reply = CuratorReply()
    last_block: str | None = None
    session_of = session_of or {}
    blocks: dict[str, list[list[str]]] = {}
    current: list[str] | None = None
    in_code = False  # inside a ``` code block opened within the current file block (not as its wrapper)
    wrapper = False  # ...or inside a fence opened as the block's first line, around the whole file
    default_source = observation_ids[-1] if observation_ids else None
    lines = text.splitlines()
    last_fence = max((i for i, x in enumerate(lines) if _FENCE.match(x)), default=-1)
    for i, raw in enumerate(lines):
        marker = _MARKER.match(raw)
        if marker and current is not None and in_code and i < last_fence:
            marker = None  # the file documents the format in a code block (closed later): content
        if marker:
            in_code = wrapper = False
            if marker[1] in MARKERS and marker[2] and not _is_label(marker[2], MARKERS[marker[1]]) \
                    and not _is_intro(marker[2]):
                # `USER_MD_UPDATE: (no changes needed)`: narration follows, not the file. The block
                # before still ends here; this line opens none.
                current, last_block = None, ""  # "": nothing to drop if the reply was cut off
                reply.declined_files.append(MARKERS[marker[1]])  # the format, answered: not garbage
                reply.ignored.append(raw.strip()[:200])
                continue
            current = []  # an unknown or forbidden marker's block is read, then dropped
            last_block = MARKERS.get(marker[1], marker[1])
            if marker[1] in MARKERS:
                blocks.setdefault(last_block, []).append(current)
            else:
                reply.ignored.append(raw.strip()[:200])
            continue
        if current is not None:
            if _FENCE.match(raw):
                # A fence that opens the block wraps the file: a marker inside it is more likely the
                # next block after a fence the model forgot to close than part of the file.
                if wrapper:
                    wrapper = False
                elif not in_code and not any(x.strip() for x in current):
                    wrapper = True
                else:
                    in_code = not in_code
            current.append(raw.rstrip())
            continue
        line = raw.strip()
        if not line or _FENCE.match(line):  # blank, or a fence around the whole reply
            continue
        if line.strip("*`").upper() == "NONE":
            reply.said_none = True
            continue
        if done := _DONE.match(line):
            reply.done_actions.append(int(done[1]))
            continue
        m = _LEARNING.match(line)
        if m and m[1].upper() in LEARNING_TYPES and len(reply.learnings) < MAX_LEARNINGS:
            kind, content = m[1].upper(), m[2].strip()
            source = default_source
            if ref := _REF.search(content):
                content = content[: ref.start()].strip()
                if int(ref[1]) in observation_ids:
                    source = int(ref[1])
            if content:
                last_block = None  # the reply's last item is now this learning
                reply.learnings.append(NewLearning(
                    type=kind, content=content[:MAX_LEARNING_CHARS],
                    session_id=session_of.get(source) if source is not None else None,
                    source_observation_id=source, confidence=CONFIDENCE[kind]))
            continue
        reply.ignored.append(line[:200])
    if truncated and last_block is not None:
        if last_block in blocks:
            reply.rejected_files.append(last_block)
            del blocks[last_block]
    elif truncated and reply.learnings:  # the last item was a learning
        reply.learnings.pop()
    for name, found in blocks.items():
        content = _file_text(found[0]) if len(found) == 1 else None
        if content is None or not content.strip():
            # Two blocks for one file (which is right?) or an empty one (a wipe is never wanted).
            reply.rejected_files.append(name)
        else:
            reply.file_updates[name] = content
    return reply


def _is_intro(text: str) -> bool:
    """`Here is the new file:`: the text ends with a colon, so it announces what follows (the file),
    unlike `(no changes needed)`. The intro itself is never file content."""
    return text.strip("*` ").endswith(":")


def _is_label(text: str, name: str) -> bool:
    """True if the text after a marker only names its file: `user.md`, `(user.md)`, `` `user.md` ``,
    `(user.md, at most 200 lines)`. `(no changes needed)` or `here it is` is not a label."""
    text = text.strip("*").strip()
    if text.startswith("(") and text.endswith(")"):
        inner = text[1:-1].strip()
        return bool(re.match(rf"`?{re.escape(name)}`?(?:$|\s*[,:;]|\s+[-–—])", inner, re.IGNORECASE))
    return bool(re.fullmatch(rf"`?{re.escape(name)}`?", text, re.IGNORECASE))


def _file_text(lines: list[str]) -> str:
    while lines and not lines[0].strip():
        lines = lines[1:]
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    if lines and sum(bool(_FENCE.match(x)) for x in lines) % 2:
        # An unpaired fence: the close (or open) of a fence that wraps the whole reply.
        if _FENCE.match(lines[-1]):
            lines = lines[:-1]
        elif _FENCE.match(lines[0]):
            lines = lines[1:]
    if lines and _FENCE.match(lines[0]) and _FENCE.match(lines[-1]) and len(lines) >= 2:
        lines = lines[1:-1]
    return "\n".join(lines) + "\n" if lines else ""
