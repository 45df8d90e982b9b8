"""`sprite-os`: serve, chat, the service, the operator's memory commands, and what deploys run.

    sprite-os [--workspace W] [serve] [--host H] [--port P] [--log-format kv|json] [--log-file F]
    sprite-os chat [--url ws://HOST:PORT]
    sprite-os memory status [--json]
    sprite-os memory search QUERY|- [--json] [--limit N] [--lexical]
    sprite-os memory recall MESSAGE|- [--json] [--session ID] [--lexical]
    sprite-os memory import FILE.jsonl
    sprite-os memory rebuild --yes [--index] [--even-if-forgotten-unreadable]
    sprite-os memory history FILE
    sprite-os memory show FILE [VERSION]
    sprite-os memory rollback FILE VERSION
    sprite-os service start|stop|restart|status
    sprite-os migrate-v1
    sprite-os install-templates DIRECTORY [--source LABEL]     (deploys: a release's memory file templates)
    sprite-os version

`--workspace` goes before the command (env SPRITE_WORKSPACE). Settings come from the environment
(see config.py); flags override them. A bad setting fails at once with one line on stderr and exit
status 2. Dev mode (a local workspace with the demo model) is not the product's: `make run`, from
devkit/.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from .. import __version__
from ..config import Settings, load_settings
from ..errors import SpriteOSError

COMMANDS = ("serve", "chat", "memory", "service", "migrate-v1", "install-templates", "version")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sprite-os", description="Sprite OS: a user's agent, with memory.")
    parser.add_argument("--workspace", help="workspace root (env SPRITE_WORKSPACE, default /workspace)")
    sub = parser.add_subparsers(dest="command")

    serve = sub.add_parser("serve", help="serve the agent on a WebSocket port (the default command)")
    serve.add_argument("--host", help="address to listen on (env SPRITE_OS_HOST)")
    serve.add_argument("--port", type=int, help="port to listen on (env SPRITE_OS_PORT, default 8765)")
    serve.add_argument("--log-format", choices=("kv", "json"), help="env SPRITE_LOG_FORMAT")
    serve.add_argument("--log-file", help="env SPRITE_LOG_FILE; rotated at 10 MB")

    chat = sub.add_parser("chat", help="talk to a running server from the terminal")
    chat.add_argument("--url", help="server URL (default ws://127.0.0.1:<SPRITE_OS_PORT>)")

    from .memory import add_memory_parser

    add_memory_parser(sub)

    service = sub.add_parser("service", help="run the server in the background on a Sprite")
    service.add_argument("action", choices=("start", "stop", "restart", "status"))

    sub.add_parser("migrate-v1", help="move a v1 workspace (agent.db, memory/*.md) into .os/")
    templates = sub.add_parser("install-templates", help="(deploys) install a release's memory file templates")
    templates.add_argument("directory", help="the release's bootstrap/templates")
    templates.add_argument("--source", default="deploy", help="how the versions are labelled in history")
    sub.add_parser("version", help="print the version")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # `sprite-os --port 9000` means `sprite-os serve --port 9000`; `--workspace W`, the command line's
    # own option, stays before the command it goes with.
    if not any(a in COMMANDS for a in argv) and not any(a in ("-h", "--help") for a in argv):
        lead = 2 if argv[:1] == ["--workspace"] else 1 if argv[:1] and argv[0].startswith("--workspace=") else 0
        if lead or not argv or argv[0].startswith("-"):
            argv = [*argv[:lead], "serve", *argv[lead:]]
    args = _parser().parse_args(argv)
    if args.command in ("serve", None, "chat"):  # a server, or a conversation: their output is theirs
        return guarded(lambda: _run(args, settings_from(args)))
    with output_may_fail() as (out, err):
        code = guarded(lambda: _run(args, settings_from(args)))
    lost = out.lost or err.lost
    if lost is None:
        return code
    if err.lost is None:  # stderr can still say it (else there is nowhere to)
        with contextlib.suppress(OSError, ValueError):
            print(f"sprite-os: error: could not write the output: {lost.strerror or lost}", file=sys.stderr,
                  flush=True)
    return code or 1


class _OutputMayFail:
    """A stream that may fail to be written. Its reader may go away (`sprite-os memory status | head -3`):
    from then on what is written goes to /dev/null, so the command goes on to its end and exits with its own status, with no
    BrokenPipeError traceback (an import or a rebuild is not cut short by the pipe it reports to). A
    stream that cannot be written (stdout on a full disk, `> /dev/full`, or a disk's I/O error) goes to
    /dev/null the same way, the error kept in `lost`: the command goes on to its end, then fails, saying so
    in one line, not in a traceback from the print that met it."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.lost: OSError | None = None

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._gone()
        except OSError as exc:
            self._gone(exc)
        return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._gone()
        except OSError as exc:
            self._gone(exc)

    def _gone(self, error: OSError | None = None) -> None:
        if error is not None and self.lost is None:
            self.lost = error
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def output_may_fail() -> Iterator[tuple[_OutputMayFail, _OutputMayFail]]:
    """stdout and stderr as `_OutputMayFail`s for the block, flushed at its end (so the exit's own
    flush finds nothing to write to a reader that left)."""
    saved = sys.stdout, sys.stderr
    streams = _OutputMayFail(sys.stdout), _OutputMayFail(sys.stderr)
    sys.stdout, sys.stderr = streams
    try:
        yield streams
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        sys.stdout, sys.stderr = saved


def settings_from(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> Settings:
    """Settings from `env` (default: the environment), with the flags in `args` over them."""
    log_file = getattr(args, "log_file", None)
    return load_settings(env).with_overrides(
        workspace=Path(args.workspace) if args.workspace else None, host=getattr(args, "host", None),
        port=getattr(args, "port", None), log_format=getattr(args, "log_format", None),
        log_file=Path(log_file) if log_file else None,
    )


def guarded(run: Callable[[], int]) -> int:
    """Run a command: a deliberate failure is one line on stderr and its exit code."""
    try:
        return run()
    except SpriteOSError as exc:
        print(f"sprite-os: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


def _run(args: argparse.Namespace, settings: Settings) -> int:
    match args.command:
        case "serve" | None:
            return _serve(settings)
        case "chat":
            from .chat import chat_main

            return chat_main(settings, args.url)
        case "memory":
            from .memory import memory_main

            return memory_main(args, settings)
        case "service":
            from .service import service_main

            return service_main(settings, args.action)
        case "migrate-v1":
            from .migrate_v1 import migrate_main

            return migrate_main(settings)
        case "install-templates":
            return _install_templates(settings, Path(args.directory), args.source)
        case "version":
            print(__version__)
            return 0
    return 2


def _serve(settings: Settings) -> int:
    """`sprite-os serve`. What refuses a start (another server on the workspace, an isolation that
    can't be had) is asked before the server's import (the agent SDK, over a second of CPU), so a
    refused start costs none of it, and writes nothing, not even its log file or a token."""
    from ..fsutil import WriterLock
    from ..isolation.probe import resolve

    settings.layout.memory_dir.mkdir(parents=True, exist_ok=True)  # where the lock lives
    lock = WriterLock(settings.layout.memory_lock, WriterLock.SERVER)
    lock.acquire()  # first: LockHeld when another server runs here
    try:
        isolation = resolve(settings.layout, settings.isolation, settings.agent_user)  # ConfigError
        with _no_collection():
            from ..server import serve_main
        return serve_main(settings, lock, isolation)
    finally:
        lock.release()


@contextlib.contextmanager
def _no_collection() -> Iterator[None]:
    """The garbage collector off over the server's import, then one full collection (its garbage freed)
    and a freeze: its modules live as long as the server, and collections would only traverse them again
    and again (measured, the collections from the import to ready: 45 ms of CPU, against 80 with the
    collector on throughout). On again after it, whatever happened, before anything runs (memory's
    start, its threads)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
        gc.collect()
        gc.freeze()
    finally:
        if was:
            gc.enable()


def _install_templates(settings: Settings, directory: Path, source: str) -> int:
    from ..memory.files import install_templates

    written = install_templates(settings.layout, directory, source)
    print(f"templates: written={','.join(written) or 'none'}")
    return 0
