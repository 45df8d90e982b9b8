"""`sprite-os chat`: a small terminal client for a running server.

Type a message and press Enter. `/new` starts a fresh session, `/stop` (or
Ctrl-C during a turn) interrupts the agent, `/quit` (or Ctrl-D) leaves. If the
connection drops, the client reconnects and resumes from the last event it saw.

With input from a pipe or file, it leaves once its messages' turns are over, and exits 1 if any
of them was refused, ended other than `completed` or was not saved (`saved: false`, shown on the
turn's line). A connection that closes before they finish is resumed like any other; it exits 1
if the resume finds one of them neither answered, running nor waiting (the server lost it: a
restart), or if the server cannot be reached again within RESUME_WAIT, whether or not its input
has ended (a long script is mostly still unsent when the server dies). Only a typed chat whose
input is still open reconnects with no bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import signal
import sys
import threading
from collections.abc import Coroutine
from typing import Any, TextIO, TypeVar

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from .. import protocol as p
from ..config import Settings, load_settings, resolve_token

T = TypeVar("T")

RESUME_WAIT = 60.0  # seconds a piped chat (or one whose input ended) tries to reach the server again


class Renderer:
    """Turns server frames into terminal lines."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.streaming = False  # text_delta output is on the current line
        self.running = False
        self.last_seq: int | None = None  # where to resume after a reconnect
        self.stream: str | None = None
        self.outstanding: set[str] = set()  # client_ids of our messages whose turns have not completed
        self._turns: dict[str, str] = {}  # turn_id -> our client_id
        self.settled = asyncio.Event()  # set while nothing of ours is outstanding
        self.settled.set()
        # Set while fewer of ours are outstanding than the server lets wait: a message is sent only then, so a
        # long script is fed as the agent takes it, never more than the server queues (the console's messages
        # share that queue, so another client can still fill it: `queue_full`, counted as a refusal).
        self.room = asyncio.Event()
        self.room.set()
        self.failed = 0  # our messages refused, or whose turns ended not completed or not saved
        # A message's id is echoed to every client and kept in the record: unique to this run, and
        # counted across its reconnects, so no other run's message (nor an earlier one of ours) has it.
        self._run = secrets.token_hex(8)  # 64 bits: a run colliding with one of the 10,000 ids the server holds is not to be met
        self._count = 0
        self.input_ended = False  # stdin's end was read: only the outstanding turns are left to wait for
        self._asked: set[str] = set()  # outstanding when the last hello went: checked once its ready and replay are in
        self._live: set[str | None] = set()  # the client ids that ready said are running or waiting
        self._replay_left = 0

    def next_id(self) -> str:
        self._count += 1
        return f"chat-{self._run}-{self._count}"

    def sent(self, client_id: str) -> None:
        self.outstanding.add(client_id)
        self._counted()

    def _counted(self) -> None:
        """`settled` and `room` as the outstanding messages now are."""
        for event, on in ((self.settled, not self.outstanding),
                          (self.room, len(self.outstanding) < p.MAX_QUEUED_MESSAGES)):
            if on:
                event.set()
            else:
                event.clear()

    def receive(self, frame: p.AnyServerFrame) -> None:
        self.last_seq = max(self.last_seq or 0, frame.seq)
        replaying = self._replay_left > 0
        if isinstance(frame, p.Ready):
            self.stream = frame.stream
            self._live = {frame.turn_client_id, *frame.waiting}
            self._replay_left = frame.replayed
        elif replaying:
            self._replay_left -= 1
        self.show(frame)
        if (isinstance(frame, p.Ready) or replaying) and not self._replay_left:
            self._resumed()

    def greeted(self) -> None:
        """The hello went: the messages out now are what its ready must account for. Not those sent after
        it, before the ready came: the server made the ready before it read them."""
        self._asked = set(self.outstanding)

    def _resumed(self) -> None:
        """A ready and the events it replayed are in: a message of ours that is neither answered (its
        turn_complete replayed), running nor waiting was lost on the server's side (a restart dropped
        it, or it never arrived), and no turn of it will complete."""
        gone = (self._asked & self.outstanding) - self._live
        self._asked = set()
        if not gone:
            return
        self.outstanding -= gone
        self._turns = {turn: ours for turn, ours in self._turns.items() if ours not in gone}
        self.failed += len(gone)
        self._counted()
        self._line(f"! after reconnecting, {len(gone)} of your messages were neither answered, running "
                   "nor waiting: their turns may not have run or been saved")
        self.out.flush()

    def refused(self, why: str) -> None:
        """A line the person typed that is not sent: a message that did not run, so the run did not succeed."""
        self.failed += 1
        self._line(f"! not sent: {why}")
        self.out.flush()

    def _line(self, text: str) -> None:
        if self.streaming:
            self.out.write("\n")
            self.streaming = False
        self.out.write(text + "\n")

    def show(self, frame: p.AnyServerFrame) -> None:
        match frame:
            case p.Ready(session_id=sid, cards=cards, replayed=n, resync=resync):
                note = f", {n} missed events follow" if n else (", state refreshed" if resync else "")
                self._line(f"· connected to session {sid}, {len(cards)} open cards{note}")
            case p.TurnStarted(text=text, turn_id=turn_id, client_id=client_id):
                self.running = True
                if client_id in self.outstanding:
                    self._turns[turn_id] = client_id
                self._line(f"you › {text}")
            case p.TextDelta(text=text):
                if not self.streaming:
                    self.out.write("agent › ")
                self.out.write(text)
                self.streaming = True
            case p.AssistantMessage(text=text):
                if not self.streaming:  # deltas already showed this text
                    self._line(f"agent › {text}")
            case p.ToolUse(name=name, summary=summary):
                self._line(f"  ⚙ {name} {summary}")
            case p.ToolResult(is_error=err, summary=summary):
                self._line(f"  {'✗' if err else '✓'} {summary[:200]}")
            case p.CardCreated(card=card) | p.CardUpdated(card=card):
                verb = "created" if isinstance(frame, p.CardCreated) else "updated"
                self._line(f"  ▣ card {verb}: {card.title} [{card.id}]")
            case p.CardClosed(card_id=cid):
                self._line(f"  ▣ card closed: {cid}")
            case p.TurnComplete(status=status, duration_ms=ms, cost_usd=cost, session_cost_usd=total,
                                turn_id=turn_id, by_server=by_server, saved=saved):
                self.running = False
                if (ours := self._turns.pop(turn_id, None)) is not None:
                    self.outstanding.discard(ours)
                    if status != "completed" or not saved:
                        self.failed += 1
                self._counted()
                price = f", ${cost:.4f}" if cost else ""
                price += f" (session ${total:.4f})" if total else ""
                said = "stopped by the server" if by_server else status  # not the person's interrupt
                self._line(f"· {said} in {ms / 1000:.1f}s{price}{'' if saved else ', saved: false'}")
            case p.SessionStarted(session_id=sid):
                self._line(f"· session {sid} started")
            case p.SessionEnded(session_id=sid, reason=reason):
                self._line(f"· session {sid} ended ({reason})")
            case p.ModelRetry(attempt=n, max_retries=most, retry_delay_ms=ms, error_status=status):
                self._line(f"· the model proxy failed ({f'HTTP {status}' if status else 'no answer'}); "
                           f"retry {n} of {most} in {ms / 1000:.1f}s")
            case p.Error(code=code, message=message, detail=detail, client_id=client_id):
                if client_id in self.outstanding:  # our message was refused: no turn of it will complete
                    self.outstanding.discard(client_id)
                    self.failed += 1
                    self._counted()
                self._line(f"! {code}: {message}" + (f"\n  ({detail})" if detail else ""))
        self.out.flush()

    def exit_code(self) -> int:
        """0 if every message of ours that ended was completed and saved, else 1."""
        return 1 if self.failed else 0


def _is_terminal(stream: TextIO | None) -> bool:
    try:
        return stream is not None and stream.isatty()
    except ValueError:  # closed
        return False


def _read_lines(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[str | None]) -> None:
    """Feed stdin's lines to `queue` from a daemon thread. A read blocked on an open terminal or
    pipe must not keep the process alive after /quit: asyncio.run waits for executor threads."""

    def read() -> None:
        while True:
            try:
                line = sys.stdin.readline()
            except (OSError, ValueError):  # closed or unreadable: as good as its end
                line = ""
            try:
                loop.call_soon_threadsafe(queue.put_nowait, line.rstrip("\n") if line else None)
            except RuntimeError:  # the loop is closed: the client has left
                return
            if not line:
                return

    threading.Thread(target=read, name="chat-stdin", daemon=True).start()


async def chat(url: str, token: str, out: TextIO = sys.stdout) -> int:
    render = Renderer(out)
    piped = not _is_terminal(sys.stdin)  # a script: nobody to press Ctrl-C on a server that never comes back
    lines: asyncio.Queue[str | None] = asyncio.Queue()
    loop = asyncio.get_running_loop()
    _read_lines(loop, lines)

    def on_sigint() -> None:  # Ctrl-C interrupts a running turn, or leaves when idle
        lines.put_nowait("/stop" if render.running else None)

    with contextlib.suppress(NotImplementedError):
        loop.add_signal_handler(signal.SIGINT, on_sigint)
    try:
        delay = 0.5
        connected = False  # reconnecting is for a server that went away, not one never reached
        lost_at: float | None = None  # when the connection was lost, until one is made again
        while True:
            try:
                async with connect(url, additional_headers={"Authorization": f"Bearer {token}"},
                                   subprotocols=[p.SUBPROTOCOL], max_size=None) as ws:  # type: ignore[list-item]
                    delay, connected, lost_at = 0.5, True, None
                    hello = p.Hello(last_seq=render.last_seq, stream=render.stream, client="sprite-os chat")
                    await ws.send(p.encode(hello).decode())
                    render.greeted()
                    return await _session(ws, render, lines)
            except InvalidStatus as exc:
                status = exc.response.status_code
                why = " (wrong token: check .os/token or SPRITE_OS_TOKEN)" if status == 401 else ""
                render._line(f"! the server refused the connection: HTTP {status}{why}")
                return 1
            except (OSError, ConnectionClosed) as exc:
                if not connected and isinstance(exc, OSError):
                    reason = exc.strerror or str(exc) or type(exc).__name__
                    render._line(f"! cannot connect to {url}: {reason}. Is the server running "
                                 "(sprite-os service status)? Another port: --url")
                    return 1
                lost_at = loop.time() if lost_at is None else lost_at
                if (piped or render.input_ended) and loop.time() - lost_at >= RESUME_WAIT:
                    render._line(f"! the server could not be reached again within {RESUME_WAIT:.0f}s: "
                                 f"{len(render.outstanding)} of your messages may not have run or been saved")
                    return 1
                render._line(f"· connection lost; reconnecting in {delay:.1f}s")
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
    finally:
        with contextlib.suppress(NotImplementedError):
            loop.remove_signal_handler(signal.SIGINT)


async def _session(ws: ClientConnection, render: Renderer, lines: asyncio.Queue[str | None]) -> int:
    """Run one connection until the person leaves (its exit status: Renderer.exit_code); ConnectionClosed
    if it drops before."""

    async def receive() -> None:
        async for message in ws:
            render.receive(p.decode_server_frame(message))

    receiver = asyncio.create_task(receive())
    try:
        while not render.input_ended:
            # The next line is read only once the server has room for it (a script's lines, all there at
            # once, would fill its queue), so no line is in hand when the connection drops.
            await _unless_closed(render.room.wait(), receiver)
            line = await _unless_closed(lines.get(), receiver)
            if line is None:  # end of input: let the turns we started finish, then leave
                render.input_ended = True
                break
            if line.strip() == "/quit":
                return render.exit_code()
            command = line.strip()
            if not command:
                continue
            frame: p.ClientFrame
            if command == "/new":
                frame = p.NewSession()
            elif command == "/stop":
                frame = p.Interrupt()
            elif len(line) > p.MAX_USER_TEXT:  # refused by the server: said here, and not sent
                render.refused(p.too_long(len(line)))
                continue
            else:
                client_id = render.next_id()
                frame = p.UserMessage(text=line, client_id=client_id)
                render.sent(client_id)
            await ws.send(p.encode(frame).decode())
        # Closed with turns outstanding: ConnectionClosed, and they are resumed.
        await _unless_closed(render.settled.wait(), receiver)
        return render.exit_code()
    finally:
        receiver.cancel()


async def _unless_closed(step: Coroutine[Any, Any, T], receiver: asyncio.Task[None]) -> T:
    """`step`'s result, or ConnectionClosed (the receiver's own error first) if the connection ends before.
    A step done in the same moment counts: a line taken off the queue is never dropped unseen."""
    task = asyncio.create_task(step)
    try:
        done, _ = await asyncio.wait({task, receiver}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        task.cancel()
    if task in done:
        return task.result()
    receiver.result()
    raise ConnectionClosed(None, None)


def server_url(settings: Settings) -> str:
    """Where this workspace's server listens: SPRITE_OS_HOST and SPRITE_OS_PORT from the environment,
    else what `sprite-os service start` remembered of them, else the defaults."""
    from .service import Service

    served = load_settings(Service(settings).child_env())
    host = Service.probe_host(served.host)
    return f"ws://{f'[{host}]' if ':' in host else host}:{served.port}"


def chat_main(settings: Settings, url: str | None) -> int:
    token = resolve_token(settings, create=False)
    url = url or server_url(settings)
    print(f"Talking to {url}. /new starts a fresh session, /stop interrupts, /quit leaves.")
    return asyncio.run(chat(url, token))
