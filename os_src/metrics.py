"""/metrics: the server's state in the Prometheus text format, for an operator's scraper (the
token required, as for everything but /healthz's status).

Two kinds of figures, from one registry of this server's own (never the library's global one):
- what happens, counted as it happens: every frame the runtime publishes passes `observe` (turns
  by status and their latency, error frames by code, the model proxy's retries);
- what is, read at each scrape from the same snapshot /healthz reports (`render(body)`): the agent's
  state, its spending today and its cap (the relay's), capture's queue and spill, turns pending curation, the curator's calls, failures,
  cost and what its replies said that was left out (memory.db's books), the recall index's backlog.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.registry import Collector

from . import protocol as p

# The classic text format, which every Prometheus reads (the names here need none of 1.0.0's escaping).
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
AGENT_STATES = ("idle", "starting", "running", "stopping")
# Turn latency, seconds: a zero-latency model's turn is ~0.1 s, a real one seconds to minutes.
TURN_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self._turns = Counter("sprite_turns", "Turns ended, by status (completed, interrupted, error).",
                              ["status"], registry=self.registry)
        self._latency = Histogram("sprite_turn_duration_seconds", "How long each turn took, as turn_complete says.",
                                  buckets=TURN_BUCKETS, registry=self.registry)
        self._errors = Counter("sprite_error_frames", "Error frames about turns sent to every client, by code.",
                               ["code"], registry=self.registry)
        self._not_saved = Counter("sprite_turns_not_saved", "Turns that ended before they could be made durable "
                                  "(turn_complete's saved: false), whatever their status.", registry=self.registry)
        self._retries = Counter("sprite_model_retries", "Retries of the agent's requests to the model proxy.",
                                registry=self.registry)
        self._state = _State()
        self.registry.register(self._state)

    def observe(self, frame: p.ServerFrame) -> None:
        """Count what a published frame says happened. Never raises into the publisher."""
        if isinstance(frame, p.TurnComplete):
            self._turns.labels(frame.status).inc()
            self._latency.observe(frame.duration_ms / 1000)
            if not frame.saved:
                self._not_saved.inc()
        elif isinstance(frame, p.Error):
            self._errors.labels(frame.code).inc()
        elif isinstance(frame, p.ModelRetry):
            self._retries.inc()

    def render(self, body: dict[str, Any]) -> bytes:
        """The text format, with the state read from `body` (the server's /healthz body)."""
        self._state.body = body
        try:
            return generate_latest(self.registry)
        finally:
            self._state.body = {}


class _State(Collector):
    """The server's state as gauges and counters, from the body it is given at each scrape."""

    def __init__(self) -> None:
        self.body: dict[str, Any] = {}

    def collect(self) -> Iterator[Metric]:
        body = self.body
        if not body:
            return
        yield _gauge("sprite_up", "1 while the agent can serve; 0 while it cannot start.",
                     0 if body["status"] == "failed" else 1)
        yield _gauge("sprite_uptime_seconds", "Seconds since the server started.", body["uptime_s"])
        yield _gauge("sprite_clients", "WebSocket clients connected.", body["clients"])
        yield from _agent(body["agent"])
        if (memory := body.get("memory")) is not None:
            yield from _memory(memory)


def _agent(agent: dict[str, Any]) -> Iterator[Metric]:
    state = GaugeMetricFamily("sprite_agent_state", "The agent's state: 1 for the one it is in.", labels=["state"])
    for name in AGENT_STATES:
        state.add_metric([name], 1 if agent["state"] == name else 0)
    yield state
    failure = agent.get("failure") or {}
    yield _gauge("sprite_agent_failed", "1 while the agent cannot start (/healthz says why).", 1 if failure else 0)
    yield _gauge("sprite_agent_failed_starts", "Failed starts of the agent in a row.", failure.get("failed_starts", 0))
    yield _gauge("sprite_agent_queued_messages", "Messages waiting for the agent.", agent["queued_messages"])
    if (budget := agent.get("budget")) is not None:
        yield _gauge("sprite_agent_spent_today_usd", "The agent's model spending today (UTC), as the relay counts it.",
                     budget["spent_today_usd"])
        yield _gauge("sprite_agent_daily_budget_usd", "The agent's daily spend cap (SPRITE_AGENT_DAILY_BUDGET_USD).",
                     budget["daily_usd"])
        refused = GaugeMetricFamily("sprite_agent_refused_calls_today",
                                    "The agent's model calls the relay refused today, by reason.", labels=["reason"])
        for reason, count in sorted(budget["refused_today"].items()):
            refused.add_metric([reason], count)
        yield refused


def _memory(memory: dict[str, Any]) -> Iterator[Metric]:
    capture = memory["capture"]
    yield _gauge("sprite_memory_degraded", "1 while memory's curator, capture's writes or the import inbox are failing, "
                 "a turn told not saved is not durable, a turn journal a start could not read is set aside or stuck, "
                 "or a forget is stuck.",
                 1 if memory["degraded"] else 0)
    yield _gauge("sprite_capture_queued", "Capture's writes waiting in memory for transcript.db.", capture["queued"])
    yield _gauge("sprite_capture_spilled", "Capture's writes waiting in the spill file.", capture["spilled"])
    yield _gauge("sprite_capture_consecutive_failures", "Capture's failed writes in a row.",
                 capture["consecutive_failures"])
    yield _gauge("sprite_capture_oldest_write_seconds", "How long capture's oldest queued write has waited.",
                 capture.get("oldest_queued_s", 0))
    yield _gauge("sprite_capture_unsaved_turns", "Turns told not saved that are still not durable.",
                 capture.get("not_saved", 0))
    yield _gauge("sprite_capture_journals_set_aside", "Turn journals a start could not read, kept in .os/state/ "
                 "for the operator (memory status says what to do).", len(capture.get("journals_set_aside") or ()))
    yield _gauge("sprite_capture_journal_stuck", "1 while an unreadable turn journal could not even be set aside: "
                 "none is written this run.", 1 if capture.get("journal_stuck") else 0)
    observations = GaugeMetricFamily("sprite_turns_recorded", "Turns in transcript.db, by curation state.",
                                     labels=["state"])
    for state in ("pending", "processed", "stale"):
        if state in memory["observations"]:
            observations.add_metric([state], memory["observations"][state])
    yield observations
    yield _gauge("sprite_curator_consecutive_failures", "The curator's failed calls in a row.",
                 memory["consecutive_failures"])
    if (totals := memory.get("totals")) is not None:
        yield _counter("sprite_curator_calls", "Curator calls memory.db records, failed ones included.",
                       totals["batches"])
        yield _counter("sprite_curator_failed_calls", "Curator calls that failed.", totals["failed_batches"])
        yield _counter("sprite_curator_cost_usd", "What the curator's calls cost, in US dollars.", totals["cost_usd"])
        yield _counter("sprite_curator_learnings_over_bound", "Learnings curator replies gave past what one call may "
                       "keep (60, or three a turn of the call if more), left out.", totals["learnings_over_bound"])
        yield _counter("sprite_curator_lines_ignored", "Lines of curator replies that fit no rule of the format, "
                       "ignored.", totals["lines_ignored"])
        yield _counter("sprite_curator_files_rejected", "Memory file rewrites curator replies gave that were not "
                       "applied: a file given twice, empty, cut off, over its limit, or one the curator may not write.", totals["files_rejected"])
    if (budget := memory.get("budget")) and "spent_today_usd" in budget:
        yield _gauge("sprite_curator_spent_today_usd", "The curator's spending today (UTC).", budget["spent_today_usd"])
        yield _gauge("sprite_curator_daily_budget_usd", "The curator's daily budget.", budget["daily_usd"])
    if (backlog := memory.get("index_backlog")) is not None:
        yield _gauge("sprite_recall_index_backlog", "Recorded turns not yet in the recall index.", backlog)
    if (forget := memory.get("forget")) is not None:
        yield _gauge("sprite_forget_jobs_waiting", "Forgets whose lines the daemon's pass has not yet taken out of "
                     "the memory files (being decided, waiting, or kept for later).", forget["jobs_waiting"])
        yield _gauge("sprite_forget_kept_seconds", "How long the daemon's pass has kept a forget's job for later "
                     "(a disk that will not rewrite, a failing search, a reader holding a WAL); 0 when none.",
                     forget["kept_for_s"] or 0)
        yield _gauge("sprite_forget_cut_short", "Forgets an error cut short: their turns keep their words until the "
                     "next start, or the person's forget again.", forget["cut_short_jobs"])


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)
