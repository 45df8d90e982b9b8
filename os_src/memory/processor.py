"""The batch processor: observations in, one stateless curator call, learnings and files out.

Order of work for one batch, chosen so a crash at any point loses nothing and
duplicates nothing:

1. read the curated files and note their hashes;
2. call the model (a crash here just means the batch runs again);
3. if a person edited a file the reply rewrites, drop the reply and run again later;
4. commit learnings, actions and the pending file rewrites to memory.db in one
   transaction (status `committed`);
5. write each file atomically, unless it changed since step 1 (status `applied`);
6. mark the observations processed in transcript.db (status `done`), but those only learnings dropped past
   the reply's bound (or its last, cut off at the token limit) cite: left pending, once, so the next batch
   sees them again (`left_pending`).

`recover()` finishes any batch a crash left between steps 4 and 6.

A person's edit that lands after step 3 is caught at step 5: that file is kept,
the batch's learnings stand, the batch is marked `superseded` (instead of
`applied`) and its observations stay pending, so they run again, as a new batch,
on the edited file (the repeated learnings are deduplicated). Recovery and
`memory rebuild` leave superseded batches alone. After MAX_EDIT_CONFLICTS in a
row, the person's version wins and the turns are done.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn

from ..config import Settings
from ..db_worker import Worker
from ..errors import BudgetSpent, CuratorError, EditConflict, FileChanged, UnusableReply
from ..logs import get_logger
from ..spending import cost_usd
from ..text import estimate_tokens
from .curation.curator import (
    PROMPT_ACTIONS,
    SYSTEM,
    TRUNCATED,
    build_prompt,
    fixed_chars,
    shorten_request,
    turn_chars,
)
from .curation.reply import CuratorReply, parse_reply
from .files import CURATED, MemoryFiles, limit_error, sha
from .forget.jobs import being_forgotten, named
from .memory_store import Batch, LeftOut, MemoryDB
from .schema import PROCESSED
from .transcript_store import Observation, TranscriptDB

if TYPE_CHECKING:
    import anthropic

log = get_logger(__name__)

CALL_TIMEOUT = 120.0
PROBE_TIMEOUT = 10.0
MAX_REPLY_TOKENS = 8192
MAX_EDIT_CONFLICTS = 3  # then a person's edits win and the batch commits without those files

# Asked before each call with its estimated input tokens; raises BudgetSpent if it may not go out.
Gate = Callable[[int], Awaitable[None]]


def input_tokens(messages: list[dict[str, Any]]) -> int:
    """A call's estimated input: the system prompt and the messages (text.CHARS_PER_TOKEN)."""
    return estimate_tokens(len(SYSTEM) + sum(len(m["content"]) for m in messages))


@dataclass
class Completion:
    text: str
    input_tokens: int
    output_tokens: int
    truncated: bool = False  # stopped at MAX_REPLY_TOKENS: the end of the reply is missing


class CuratorClient:
    """The one model the daemon talks to, through Bridge's proxy. No retries here: the
    daemon owns backoff, so a failing proxy costs one attempt per backoff step.

    The anthropic SDK takes seconds to import (it was most of a server's start), and a server may
    never curate: it is imported on a thread once the first turn is recorded (`warm`, as a batch
    will follow), or at the first call."""

    def __init__(self, settings: Settings) -> None:
        self._env = settings.model_env()
        self.model = settings.memory_model
        self._client: anthropic.AsyncAnthropic | None = None
        self._sdk: asyncio.Future[Any] | None = None

    def warm(self) -> None:
        """Start importing the SDK in the background, once. From the event loop; never waits."""
        if self._sdk is None:
            self._sdk = asyncio.ensure_future(asyncio.to_thread(importlib.import_module, "anthropic"))

    async def _the_client(self) -> anthropic.AsyncAnthropic:
        if self._client is None:
            self.warm()
            assert self._sdk is not None
            sdk = await asyncio.shield(self._sdk)
            self._client = sdk.AsyncAnthropic(
                api_key=self._env["ANTHROPIC_API_KEY"], base_url=self._env.get("ANTHROPIC_BASE_URL"),
                max_retries=0, timeout=CALL_TIMEOUT,
            )
        return self._client

    async def complete(self, messages: list[dict[str, Any]]) -> Completion:
        """One call. Whatever goes wrong with it (an HTTP error, a dropped connection, a 200 whose
        body is cut off or not what the API returns) is a CuratorError, so the daemon counts it."""
        client = await self._the_client()
        try:
            response = await client.messages.create(
                model=self.model, max_tokens=MAX_REPLY_TOKENS, system=SYSTEM, messages=messages,  # type: ignore[arg-type]
            )
            text = "".join(getattr(block, "text", "") for block in response.content)
            usage = response.usage  # what the proxy bills; cached input (none is asked for) counted in full
            billed_in = (usage.input_tokens + (usage.cache_creation_input_tokens or 0)
                         + (usage.cache_read_input_tokens or 0))
            return Completion(text, billed_in, usage.output_tokens,
                              truncated=response.stop_reason == "max_tokens")
        except Exception as exc:  # not only anthropic.APIError: a cut-off body raises JSONDecodeError
            raise CuratorError(f"{type(exc).__name__}: {exc}") from exc

    async def probe(self) -> bool:
        """Whether the proxy answers now: a token count (no model call, nothing billed), quickly.
        Any HTTP answer counts, an error status too (a proxy that lacks the endpoint, or is busy,
        is up: the batch's own call says the rest); only no answer (refused, reset, timed out) is down."""
        try:
            client = await self._the_client()
            await client.messages.count_tokens(model=self.model, messages=[{"role": "user", "content": "ping"}],
                                               timeout=PROBE_TIMEOUT)
        except Exception as exc:
            status = getattr(exc, "status_code", None)  # anthropic.APIStatusError: the proxy answered
            if isinstance(status, int):
                log.info("curator_probe_answered", status=status)
                return True
            log.info("curator_probe_unanswered", error=type(exc).__name__)
            return False
        return True

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()


async def _nothing() -> None:
    pass


@dataclass
class BatchResult:
    batch_id: int
    observations: int
    learnings_added: int
    files_written: list[str] = field(default_factory=list)
    files_kept: list[str] = field(default_factory=list)  # over a limit, rejected, or edited by a person
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0


class BatchProcessor:
    def __init__(self, transcript: Worker[TranscriptDB], memory: Worker[MemoryDB], files: MemoryFiles,
                 curator: CuratorClient) -> None:
        self.transcript = transcript
        self.memory = memory
        self.files = files
        self.curator = curator
        self.on_commit: Callable[[], Awaitable[object]] = _nothing

    async def pending(self, limit: int) -> list[Observation]:
        """The oldest pending turns but those a forget job names: their words go to no call. A forget an error cut
        short keeps its job, its turns pending, until the next start or the person's forget again; each batch
        carrying them, discarded as forgotten during the call, ran again 2 s later, a paid call each time."""
        held = await self.memory.call(named)
        return await self.transcript.call(lambda t: t.pending(limit, leaving_out=held))

    async def recover(self) -> int:
        """Finish batches that a crash interrupted after their commit."""
        batches = await self.memory.call(lambda m: m.unfinished_batches())
        for batch in batches:
            log.info("batch_recovering", batch_id=batch.id, status=batch.status)
            await self._finish(batch, rerun_if_edited=True)  # a rerun goes through pending() as usual
        return len(batches)

    async def turn_budget(self, max_tokens: int) -> int:
        """Characters of turns the next call may carry within `max_tokens`, beside the files and
        actions it will show (curator.turn_chars)."""
        files = await asyncio.to_thread(self.files.read_all)
        actions = await self.memory.call(lambda m: m.pending_actions(PROMPT_ACTIONS))
        return turn_chars(max_tokens, fixed_chars(files, actions))

    async def process(self, observations: list[Observation], trigger: str, conflicts: int = 0,
                      gate: Gate | None = None) -> BatchResult:
        """Curate `observations`. `gate` is asked before each call (the daemon's budget): a refusal
        before the first raises BudgetSpent with nothing recorded; before the second (a request to
        shorten), the batch goes on with the first reply."""
        before = await asyncio.to_thread(self.files.read_all)
        actions = await self.memory.call(lambda m: m.pending_actions(PROMPT_ACTIONS))
        ended = await self.transcript.call(lambda t: t.ended_sessions(o.session_id for o in observations))
        call = _Call(self, observations, trigger, gate, build_prompt(before, observations, actions, ended))
        reply = await self._usable_reply(call)
        forgotten = await self.transcript.call(lambda t: t.forgotten_among(call.ids))
        if forgotten := forgotten or await self.memory.call(lambda m: being_forgotten(m, call.ids)):
            await _forgotten_during(call, forgotten)
        updates = {n: t for n, t in reply.file_updates.items() if limit_error(n, t) is None}
        kept = sorted(set(reply.file_updates) - set(updates)) + reply.rejected_files
        for name in kept:
            log.warning("curated_file_kept", file=name, reason="over its limit or ambiguous in the reply")
        # A person's edit winning (below) is not the reply's doing; a foreign block is a rewrite, never applied.
        left_out = LeftOut(learnings_over_bound=reply.over_bound, lines_ignored=reply.lines_ignored,
                           files_rejected=len(kept) + reply.foreign_rewrites)
        kept += await self._drop_edited(call, before, updates, conflicts)

        ids, model, tokens = call.ids, self.curator.model, call.tokens
        # Looked for again in the commit's own call on memory.db's one thread: a forget that began since the look
        # above (its job goes on disk before it deletes anything) would have purged before this commit.
        batch = await self.memory.call(lambda m: being_forgotten(m, ids) or m.commit_batch(
            trigger=trigger, observation_ids=ids, model=model, input_tokens=tokens[0], output_tokens=tokens[1],
            cost_usd=cost_usd(model, *tokens), learnings=reply.learnings, file_updates=updates,
            base_hashes={n: sha(before[n]) for n in updates},
            done_actions=[a for a in reply.done_actions if a in {x.id for x in actions}], left_out=left_out,
            left_pending=sorted(reply.cited_only_by_dropped),
        ))
        if isinstance(batch, list):
            await _forgotten_during(call, batch)
        await self.on_commit()  # the recall index takes the new learnings before the turns count as done
        written = await self._finish(batch, rerun_if_edited=conflicts + 1 < MAX_EDIT_CONFLICTS)
        if written is None:  # a person edited a file between the check above and the write
            log.info("batch_edit_conflict", batch_id=batch.id, attempt=conflicts + 1, late=True)
            raise EditConflict(f"a file was edited before batch {batch.id} could write it")
        log.info("batch_done", batch_id=batch.id, trigger=trigger, observations=len(ids),
                 learnings=batch.learnings_added, files=written, kept=kept, input_tokens=tokens[0],
                 output_tokens=tokens[1], cost_usd=round(batch.cost_usd, 6))
        return BatchResult(batch.id, len(ids), batch.learnings_added, written, kept, tokens[0], tokens[1],
                           batch.cost_usd)

    async def _usable_reply(self, call: _Call) -> CuratorReply:
        """The reply, or UnusableReply; one request to shorten a reply over a limit or cut off."""
        reply = await call.ask()
        if not reply.recognised:
            await call.failed("reply did not follow the format")
            raise UnusableReply("curator reply did not follow the format")
        problems = [e for n, t in reply.file_updates.items() if (e := limit_error(n, t))]
        if call.truncated:
            problems.append(TRUNCATED)
        if problems:
            log.warning("curator_over_limit", problems=problems)
            call.messages.append({"role": "user", "content": shorten_request(problems)})
            try:
                retry = await call.ask(record_failure=False)  # the batch goes on with the first reply
            except (CuratorError, BudgetSpent):
                retry = None
            if retry is not None and retry.recognised:
                reply = retry
        return reply

    async def _drop_edited(self, call: _Call, before: dict[str, str], updates: dict[str, str],
                           conflicts: int) -> list[str]:
        """A person edited a file the reply rewrites while the call ran: the batch runs again on the
        edited file (EditConflict), or after MAX_EDIT_CONFLICTS in a row, the person's version wins
        (those files are dropped from `updates` and returned)."""
        after = await asyncio.to_thread(self.files.read_all)
        edited = [n for n in updates if sha(after[n]) != sha(before[n])]
        if edited and conflicts + 1 < MAX_EDIT_CONFLICTS:
            log.info("batch_edit_conflict", files=edited, attempt=conflicts + 1)
            await call.failed(f"discarded: {', '.join(edited)} edited during the call")  # it was paid for
            raise EditConflict(", ".join(edited))
        for name in edited:
            del updates[name]
        return edited

    async def _finish(self, batch: Batch, rerun_if_edited: bool) -> list[str] | None:
        """Apply a committed batch. Returns the files written, or None if a person edited one of
        them since the batch read it and `rerun_if_edited`: then its observations stay pending.

        The edit is known before any status is written, so such a batch goes from `committed`
        straight to `superseded`, never through `applied`: a crash before that one write leaves it
        `committed`, and recovery writes the files again (a no-op), finds the edit again and
        supersedes it; `applied` always means "mark the observations processed"."""
        written: list[str] = []
        edited: list[str] = []
        if batch.status == "committed":
            written, edited = await asyncio.to_thread(self._write_files, batch)
            if edited and rerun_if_edited:
                await self.memory.call(lambda m: m.set_batch_status(batch.id, "superseded"))
                log.info("batch_superseded", batch_id=batch.id, files=edited)
                return None
            await self.memory.call(lambda m: m.set_batch_status(batch.id, "applied"))
        if batch.left_pending:
            log.info("batch_left_turns_pending", batch_id=batch.id, turns=len(batch.left_pending))
        await self.transcript.call(lambda t: t.set_processed(batch.curated_ids, PROCESSED))
        await self.memory.call(lambda m: m.set_batch_status(batch.id, "done"))
        return written

    def _write_files(self, batch: Batch) -> tuple[list[str], list[str]]:
        """(written, edited): the files rewritten, and those a person changed since the batch read them."""
        written, edited = [], []
        for name in CURATED:
            if name not in batch.file_updates:
                continue
            target = batch.file_updates[name]
            if sha(self.files.read(name)) == sha(target):
                continue  # already written before a crash
            # Batch ids restart after a rebuild; the label keeps the two histories apart.
            prefix = "rebuild-batch" if batch.trigger == "rebuild" else "batch"
            try:
                self.files.write(name, target, source=f"{prefix}-{batch.id}", expect=batch.base_hashes.get(name))
            except FileChanged:
                log.info("curated_file_kept", file=name, reason="edited by a person after the batch read it")
                edited.append(name)
                continue
            written.append(name)
        return written, edited

    async def record_failure(self, trigger: str, ids: list[int], error: str, tokens: list[int]) -> None:
        model = self.curator.model
        await self.memory.call(lambda m: m.record_failed_batch(
            trigger=trigger, observation_ids=ids, model=model, error=error, input_tokens=tokens[0],
            output_tokens=tokens[1], cost_usd=cost_usd(model, *tokens)))


class _Call:
    """One batch's conversation with the curator: its messages, and the tokens it has cost."""

    def __init__(self, processor: BatchProcessor, observations: list[Observation], trigger: str,
                 gate: Gate | None, prompt: str) -> None:
        self._processor = processor
        self._sessions = {o.id: o.session_id for o in observations}
        self.ids = [o.id for o in observations]
        self.trigger = trigger
        self._gate = gate
        self.messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
        self.tokens = [0, 0]
        self.truncated = False

    async def ask(self, record_failure: bool = True) -> CuratorReply:
        if self._gate is not None:
            await self._gate(input_tokens(self.messages))
        try:
            done = await self._processor.curator.complete(self.messages)
        except CuratorError as exc:
            if record_failure:
                await self.failed(str(exc))
            raise
        self.tokens[0] += done.input_tokens
        self.tokens[1] += done.output_tokens
        self.truncated = done.truncated
        self.messages.append({"role": "assistant", "content": done.text or "(empty)"})
        reply = parse_reply(done.text, self.ids, self._sessions, done.truncated)
        if reply.over_bound:
            log.warning("curator_learnings_over_bound", dropped=reply.over_bound, kept=len(reply.learnings),
                        turns=len(self.ids))
        if reply.ignored:  # the lines may quote the person: their text only at debug level
            log.warning("curator_lines_ignored", count=len(reply.ignored))
            log.debug("curator_lines_ignored_text", lines=reply.ignored[:5])
        return reply

    async def failed(self, error: str) -> None:
        """Record the call as a failed batch, with what it cost."""
        await self._processor.record_failure(self.trigger, self.ids, error, self.tokens)


async def _forgotten_during(call: _Call, forgotten: list[int]) -> NoReturn:
    """A person forgot a turn of the batch during its call: nothing it learned may stand; the rest runs again."""
    await call.failed(f"discarded: {len(forgotten)} of its turns were forgotten during the call")
    raise EditConflict("a turn was forgotten during the call")
