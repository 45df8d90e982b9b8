"""Docs that can't drift: what the README and docs/ name exists, and nothing cites a ticket.

A reader can open a file a page names, and follow its links; a module that moves or goes makes
this fail until the page says where it went. Code, comments and docs say the reason for a thing,
never "issue 12" or "seed 002": a reader can't open those.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", REPO / "tests" / "README.md", *sorted((REPO / "docs").glob("*.md"))]
TICKETS = re.compile(r"\b[Ii]ssues? #?\d+\b|\b[a-z]+(?:-[a-z]+)+ #\d+\b|\b[Ss]eeds? #?\d+\b|\(issue \d|\b[Tt]he (?:issue|seed)'s\b|seeds/000")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
# A source file's path in backticks: `os_src/memory/loader.py`, `memory/loader.py`, `tests/test_x.py::name`
# (not a workspace's files: `.os/...`, a release's `src/...`).
PATH = re.compile(r"`((?!src/|current/|releases/)(?:[\w-]+/)+[\w.-]+\.(?:py|js|html|css))(?:::\w+)?`")
ROOTS = (REPO, REPO / "os_src", REPO / "os_src" / "memory", REPO / "devkit")  # where a page's path may start


def tracked() -> list[Path]:
    names = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return [REPO / n for n in names.splitlines() if (REPO / n).is_file()]


def test_nothing_cites_an_issue_or_a_seed_by_number() -> None:
    found = []
    for path in tracked():
        if path.suffix in (".png", ".bin", ".lock", ".gz") or path == Path(__file__):
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        found += [f"{path.relative_to(REPO)}:{n}: {line.strip()[:80]}"
                  for n, line in enumerate(text.splitlines(), 1) if TICKETS.search(line)]
    assert found == [], "say the reason instead"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_link_and_file_a_page_names_exists(page: Path) -> None:
    text = page.read_text()
    missing = [f"link {target}" for target in LINK.findall(text)
               if not target.startswith(("http://", "https://", "mailto:")) and not (page.parent / target).exists()]
    missing += [f"file {name}" for name in PATH.findall(text)
                if not any((root / name).exists() for root in ROOTS) and "<" not in name and "*" not in name]
    assert missing == []


def test_the_architecture_tree_names_every_module() -> None:
    """docs/architecture.md's tree is where a newcomer looks for a module: each one is there."""
    page = (REPO / "docs" / "architecture.md").read_text()
    tree = page.split("## The tree", 1)[1].split("```", 2)[1]
    named = set(re.findall(r"[\w]+\.py\b", tree))
    modules = {p.name for p in (REPO / "os_src").rglob("*.py") if not p.name.startswith("__")}
    assert sorted(modules - named) == []


def test_each_module_the_architecture_tree_names_is_in_the_folder_it_is_drawn_in() -> None:
    """The tree's lines sit under their folder (`capture/` under `memory/`, the names after a folder
    on its continuation lines): a module moved to another folder makes this fail until the tree moves
    it too."""
    page = (REPO / "docs" / "architecture.md").read_text()
    tree = page.split("## The tree", 1)[1].split("```", 2)[1]
    folders: dict[int, str] = {}  # indent -> folder
    here, misplaced = "", []
    for line in filter(str.strip, tree.splitlines()):
        indent, first = len(line) - len(line.lstrip()), line.split()[0]
        if indent <= 4 and first.endswith(("/", ".py")):  # a folder's line, or a root module's
            folders = {i: f for i, f in folders.items() if i < indent} | ({indent: first} if first.endswith("/") else {})
            here = "".join(folders[i] for i in sorted(folders))
        misplaced += [f"{here}{name}" for name in re.findall(r"(?<![\w/])(\w+\.py)\b", line)
                      if not (REPO / here / name).is_file()]
    assert misplaced == []


def _default_shown(default: object, shown: str) -> bool:
    if isinstance(default, bool):
        return shown == ("on" if default else "off")
    if isinstance(default, int | float):
        return float(shown) == default
    return shown == str(default)


def test_the_pages_list_every_setting_with_its_default() -> None:
    """README's Configuration table is the operator's list of settings: every variable config.py
    reads is in it, nothing else. Each default a page's table of settings gives (README's, memory.md's)
    is the one config.py has."""
    from dataclasses import fields

    from sprite_os.config import _ENV, ENV_VARS, Settings

    defaults = {f.name: f.default for f in fields(Settings)}
    listed, wrong = [], []
    for page in PAGES:
        text = page.read_text()
        for row in re.findall(r"^\| (`[A-Z_]+`(?:, `[A-Z_]+`)*) \|([^|]*)\|", text, re.M):
            names = re.findall(r"`([A-Z_]+)`", row[0])
            listed += names if page.name == "README.md" else []
            for name, shown in zip(names, re.findall(r"`([^`]+)`", row[1]) or row[1].split(","), strict=False):
                default = defaults[_ENV[name][0]] if name in _ENV else None
                if default not in (None, ()) and not _default_shown(default, shown.strip()):
                    wrong.append(f"{page.relative_to(REPO)}: {name}: {shown.strip()!r}, config {default!r}")
    assert sorted(listed) == sorted(ENV_VARS)
    assert wrong == []


def _frames() -> dict[str, type]:
    """Every frame of the wire format by its `type`, both ways."""
    import typing

    from sprite_os import protocol

    def leaves(union: object) -> list[object]:
        return [leaf for arg in typing.get_args(union) for leaf in leaves(arg)] or [union]

    return {cls.__struct_config__.tag: cls for cls in leaves(protocol.AnyClientFrame) + leaves(protocol.AnyServerFrame)
            if isinstance(cls, type) and hasattr(cls, "__struct_config__")}


def test_protocol_md_shows_the_frames_the_code_defines() -> None:
    """docs/protocol.md against os_src/protocol.py: each example's `type` is a frame and its fields
    are that frame's (a `"...": "..."` marks an example cut short); each frame has its heading."""
    import json

    text = (REPO / "docs" / "protocol.md").read_text()
    frames, decoder, wrong, shown = _frames(), json.JSONDecoder(), [], set()
    for block in re.findall(r"```json\n(.*?)```", text, re.S):
        at = 0
        while (at := len(block) - len(block[at:].lstrip())) < len(block):
            example, at = decoder.raw_decode(block, at)
            if "type" not in example:
                continue  # a part of a frame (a file's description)
            cls, keys = frames.get(example["type"]), set(example) - {"type"}
            if cls is None:
                wrong.append(f"no frame {example['type']!r}")
                continue
            shown.add(example["type"])
            fields = set(cls.__struct_fields__)  # type: ignore[attr-defined]
            wrong += [f"{example['type']}.{key}: no such field" for key in sorted(keys - fields - {"..."})]
            if "..." not in keys and example["type"] in ("ready", "turn_complete", "recall", "model_retry"):
                wrong += [f"{example['type']}.{f}: not shown" for f in sorted(fields - keys)]
    headings = set(re.findall(r"`(\w+)`", " ".join(re.findall(r"^### (.*)$", text, re.M))))
    wrong += [f"no heading names {tag!r}" for tag in sorted(set(frames) - headings) if not tag.endswith("_result")]
    wrong += [f"a heading names {tag!r}, no frame" for tag in sorted(headings - set(frames))]
    assert wrong == []
    assert len(shown) > 40


def test_protocol_md_lists_every_error_code_once() -> None:
    import typing

    from sprite_os.protocol import ErrorCode

    codes = {code for arg in typing.get_args(ErrorCode) for code in (typing.get_args(arg) or [arg])}
    text = (REPO / "docs" / "protocol.md").read_text()
    section = text.split("## Errors and limits", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^\| `(\w+)` \|", section, re.M)
    assert sorted(listed) == sorted(codes)


def _figures() -> list[tuple[str, str]]:
    """(page, words) that say a limit the code sets: each figure said on a page is the code's."""
    from sprite_os import deploy_contract, events, gateway, stopping
    from sprite_os import protocol as p
    from sprite_os.agent import frames
    from sprite_os.commands import chat, memory_import
    from sprite_os.commands import memory as memory_command
    from sprite_os.console import downloads, files_api, files_frames, session_frames
    from sprite_os.isolation import cgroups, launch, resources
    from sprite_os.memory import files, import_inbox, system
    from sprite_os.memory.capture import health, journal, recorder, writer
    from sprite_os.memory.curation import curator
    from sprite_os.memory.forget import decisions, turns
    from sprite_os.tools import canvas

    mib = 1024 * 1024
    retry = import_inbox.IMPORT_RETRY
    forget_retry = turns.PASS_RETRY
    decide = ", ".join(f"{pause:.0f} s" for pause in decisions.DECIDE_RETRIES[:-1])
    decide_last = f"{decisions.DECIDE_RETRIES[-1] / 60:.0f} minutes"
    return [
        ("docs/protocol.md", f"up to {p.MAX_QUEUED_MESSAGES} may wait"),
        ("README.md", f"never more waiting than the server queues, {p.MAX_QUEUED_MESSAGES})"),
        ("README.md", f"can't be reached again within {chat.RESUME_WAIT:.0f} s, whether or not all its lines"),
        ("docs/reliability.md", f"cannot be reached again within {chat.RESUME_WAIT:.0f} s (whether or not"),
        ("README.md", f"never more waiting than the server queues, {p.MAX_QUEUED_MESSAGES}"),
        ("docs/reliability.md", f"at most {p.MAX_QUEUED_MESSAGES} of its messages out at once"),
        ("docs/protocol.md", f"the last {events.REPLAY_BUFFER:,} events, and at most {events.REPLAY_BYTES // mib} MB"),
        ("docs/protocol.md", f"more than {events.SUBSCRIBER_QUEUE:,} frames or {events.SUBSCRIBER_BYTES // mib} MB"),
        ("docs/protocol.md", f"close code **{gateway.CLOSE_LAGGING}**"),
        ("docs/protocol.md", f"one `text_delta` per turn every {events.DELTA_INTERVAL * 1000:.0f} ms"),
        ("docs/protocol.md", f"one line of at most {frames.SUMMARY_CHARS} characters"),
        ("docs/protocol.md", f"up to {canvas.MAX_BODY:,} characters. At most {canvas.MAX_OPEN_CARDS} cards"),
        ("docs/protocol.md", f"more than {gateway.RATE_PER_SECOND:.0f} frames per second (bursts of {gateway.RATE_BURST}"),
        ("docs/protocol.md", f"| {gateway.CLOSE_POLICY} | more than {gateway.FLOOD_LIMIT} frames dropped"),
        ("docs/protocol.md", f"a frame over {gateway.MAX_FRAME_CHARS // mib} MiB"),
        ("docs/protocol.md", f"`limit` (1 to {session_frames.MAX_SESSIONS}, default 20)"),
        ("docs/protocol.md", f"`limit` (1 to {session_frames.TURNS_PER_PAGE}, default 30)"),
        ("docs/protocol.md", f"at most {session_frames.MAX_FORGET:,} ids a request"),
        ("docs/protocol.md", f"chunks of at most {files_frames.CHUNK_BYTES // 1024} KiB"),
        ("docs/protocol.md", f"At most {downloads.MAX_DOWNLOADS} are\nopen at once over every connection and "
                             f"{downloads.PER_CLIENT} under way on one"),
        ("docs/protocol.md", f"lingers {downloads.LINGER:.0f} s"),
        ("docs/protocol.md", f"keeping {files_api.DISK_RESERVE // mib} MB free"),
        ("docs/deploy.md", f"the {stopping.STOP_TIMEOUT:.0f} s after which `service stop` sends SIGKILL"),
        ("docs/deploy.md", f"the last {stopping.MEMORY_RESERVE:.0f} s are memory's"),
        ("docs/deploy.md", f"the turn recorded as it stood | {stopping.TURN_GRACE:.0f} s"),
        ("docs/deploy.md", f"beside the turn | {stopping.REQUEST_GRACE:.0f} s"),
        ("docs/deploy.md", f"the CLI disconnects | {stopping.CLI_END:.0f} s"),
        ("docs/deploy.md", f"({stopping.CLIENTS:.0f} s at least)"),
        ("docs/deploy.md", f"came from its turns | {stopping.DECISION:.0f} s"),
        ("docs/deploy.md", f"the turn journal is synced | {stopping.CAPTURE:.0f} s"),
        ("docs/deploy.md", f"the curator's last batch | {stopping.FLUSH:.0f} s"),
        ("docs/deploy.md", f"the databases closed | {stopping.STORES:.0f} s"),
        ("docs/deploy.md", f"the process exits | {stopping.EXIT:.0f} s"),
        ("docs/deploy.md", f"of the lock's {_lock_wheels()} wheels"),
        ("docs/deploy.md", "W/{" + ",".join(deploy_contract.USER_SPACE_DIRS) + "}/"),
        ("docs/deploy.md", f"W/.os/{deploy_contract.AGENT_DIR}/ "),
        ("docs/memory.md", f"The cap can't be set below about 43,000 ({curator.MIN_BATCH_TOKENS:,} "),
        ("docs/memory.md", f"event loop from {journal.OPEN_GRACE * 1000:.0f} ms after the turn opens, "
                           f"then at most every {journal.DELAY * 1000:.0f} ms"),
        ("docs/memory.md", f"a kill -9 in its first {journal.OPEN_GRACE * 1000:.0f} ms"),
        ("docs/architecture.md", f"holds the turn on disk (from {journal.OPEN_GRACE * 1000:.0f} ms after it opens"),
        ("docs/reliability.md", f"The open turn is on disk from {journal.OPEN_GRACE * 1000:.0f} ms after it opens"),
        ("README.md", f"unless `{memory_command.REBUILD_ANYWAY}`"),
        ("docs/memory.md", f"or pass `{memory_command.REBUILD_ANYWAY}` to rebuild anyway"),
        ("docs/memory.md", f"for {memory_import.STALL_WAIT:.0f} s (its attempts failing, say on a full disk, each "
                           f"reports; after a failed one,\n  the retry's longest wait, {retry.max / 60:.0f} minutes, "
                           "comes on top)"),
        ("docs/reliability.md", f"or gives up after {memory_import.STALL_WAIT:.0f} s in which the server wrote no new "
                                f"report of the file (exit 1, the file queued; every attempt reports, a failed one too, "
                                f"and after a failed one the retry's longest wait, {retry.max / 60:.0f} min, comes on top)"),
        ("docs/memory.md", f"growing wait ({retry.first:.0f} s, {retry.first * 2:.0f} s, {retry.first * 4:.0f} s … up\n"
                           f"  to {retry.max / 60:.0f} minutes), and after "
                           f"{_count(import_inbox.FAILED_ATTEMPTS_DEGRADED)} failed in a row"),
        ("docs/memory.md", f"After {import_inbox.MAX_ATTEMPTS}\n  failed in a row"),
        ("docs/reliability.md", f"tries again from where the last attempt got to, {retry.first:.0f} s later, then "
                                f"{retry.first * 2:.0f}, {retry.first * 4:.0f} … up to {retry.max / 60:.0f} min"),
        ("docs/reliability.md", f"after {import_inbox.MAX_ATTEMPTS} failed attempts in a row (about 10 minutes)"),
        ("docs/protocol.md", f"import file the server gave up on after {import_inbox.MAX_ATTEMPTS} failed attempts"),
        ("docs/protocol.md", f"After {import_inbox.MAX_ATTEMPTS} failed attempts in a row the server gives up on the file"),
        ("docs/reliability.md", f"`degraded` after {import_inbox.FAILED_ATTEMPTS_DEGRADED} failed attempts in a row"),
        ("docs/protocol.md", f"attempts have failed {_count(import_inbox.FAILED_ATTEMPTS_DEGRADED, 'times')} or more"),
        ("docs/protocol.md", f"has still not reached `transcript.db` after {system.FORGET_DRAIN_BUDGET:.0f} s"),
        ("docs/reliability.md", f"still waits in capture's queue after {system.FORGET_DRAIN_BUDGET:.0f} s"),
        ("docs/protocol.md", f"waited more than {health.STALLED_AFTER:.0f} s (`oldest_queued_s`"),
        ("docs/protocol.md", f"has kept a forget's job for later for {turns.KEPT_STUCK:.0f} s or more"),
        ("docs/memory.md", f"has been kept {turns.KEPT_STUCK:.0f} s (`KEPT_STUCK`)"),
        ("docs/reliability.md", f"once the job has been kept {turns.KEPT_STUCK:.0f} s"),
        ("docs/reliability.md", f"once the pass has kept the job {turns.KEPT_STUCK:.0f} s or more"),
        ("docs/protocol.md", f"tried again {forget_retry.first:.0f} s later, then {forget_retry.first * 2:.0f}, "
                             f"{forget_retry.first * 4:.0f} … up to {forget_retry.max / 60:.0f} minutes, so the state"),
        ("docs/reliability.md", f"asked for {forget_retry.first:.0f} s later, then {forget_retry.first * 2:.0f}, "
                                f"{forget_retry.first * 4:.0f} … up to {forget_retry.max / 60:.0f} minutes (an idle"),
        ("docs/memory.md", f"the check is tried again after {decide}, then every {decide_last} until it succeeds"),
        ("docs/protocol.md", f"those tries are the decision's, {decide}, then every {decide_last} apart"),
        ("docs/memory.md", f"retried with backoff ({health.LOCAL_DISK.first} s doubling to\n  "
                           f"{health.LOCAL_DISK.max:.0f} s)"),
        ("docs/memory.md", f"the spill file takes the turn after the first failed attempt, about "
                           f"{writer.ATTEMPT_BUSY_TIMEOUT_MS / 1000:.0f} s"),
        ("docs/memory.md", f"or past {recorder.DURABLE_WAIT:.0f} s on a disk that hangs"),
        ("docs/console.md", f"Past the file's limits (its lines, or {files.MAX_FILE_BYTES:,} bytes)"),
        *[(page, f"kept for the server ({resources.MIN_SERVER_MEMORY // mib} MiB of it at least")
          for page in ("README.md", "docs/security.md")],
        ("docs/security.md", f"`cpu.weight={cgroups.CPU_WEIGHT_V2}` (the server's 100) | "
                             f"`cpu.shares={cgroups.CPU_SHARES_V1}` (1024) | `nice {resources.AGENT_NICE}`"),
        ("docs/security.md", f"At least {resources.MIN_DISK_RESERVE // mib} MiB of them"),
        ("docs/security.md", f"`oom_score_adj={launch.OOM_SCORE_ADJ}` marks the agent's processes"),
    ]


def _count(n: int, word: str = "") -> str:
    """`n` as the pages spell it: "two", "twice" (`word` "times")."""
    if word == "times":
        return {1: "once", 2: "twice"}.get(n, f"{n} times")
    return {1: "one", 2: "two", 3: "three"}.get(n, str(n))


def _lock_wheels() -> int:
    lines = (REPO / "bootstrap" / "requirements.lock").read_text().splitlines()
    return sum(1 for line in lines if line.strip() and not line.startswith("#"))


def test_the_limits_the_pages_state_are_the_codes() -> None:
    said = {page: " ".join((REPO / page).read_text().split()) for page in {page for page, _ in _figures()}}
    missing = [f"{page}: {words!r}" for page, words in _figures() if " ".join(words.split()) not in said[page]]
    assert missing == []


def test_a_test_a_page_names_is_there() -> None:
    """`tests/test_x.py::test_name` (and `::test_other` after it, of the same file) name tests that
    exist: a renamed or removed test makes this fail until the page names what proves it now."""
    missing = []
    for page in PAGES:
        for n, line in enumerate(page.read_text().splitlines(), 1):
            module = None
            for token in re.findall(r"`([^`]+)`", line):
                name = re.fullmatch(r"((?:tests|chaos|bench)/[\w/]+\.py)?(?:::(\w+))?", token)
                if name is None or not any(name.groups()):
                    continue
                module = name[1] or module
                if name[2] and (module is None or not re.search(
                        rf"^(?:async )?def {name[2]}\b", (REPO / module).read_text(), re.M)):
                    missing.append(f"{page.relative_to(REPO)}:{n}: {module}::{name[2]}")
    assert missing == []


def test_every_command_is_in_the_usage_and_the_docs() -> None:
    """Each `sprite-os` command and flag is in commands/main.py's usage, and each command an
    operator types is named in README.md or docs/ (`memory` under its own subcommands)."""
    import argparse

    from sprite_os.commands import main

    usage = main.__doc__ or ""
    docs = " ".join(page.read_text() for page in PAGES)

    def commands(parser: argparse.ArgumentParser, path: str) -> list[tuple[str, list[str]]]:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        flags = [o for a in parser._actions for o in a.option_strings if o.startswith("--") and o != "--help"]
        if not subs:
            return [(path, flags)]
        return [c for name, sub in subs[0].choices.items() for c in commands(sub, f"{path} {name}".strip())]

    wrong = []
    for command, flags in commands(main._parser(), ""):
        lines = [line for line in usage.splitlines() if re.search(rf"sprite-os (?:\[[^]]*\] )*\[?{command}\b", line)]
        if not lines:
            wrong.append(f"usage: no `sprite-os {command}`")
        wrong += [f"usage: `sprite-os {command}` without {flag}" for flag in flags if not any(flag in x for x in lines)]
        words = command.split()
        if command != "serve" and not re.search(rf"sprite-os {words[0]}\b" + "".join(
                rf"[^`|]*\b{w}\b" for w in words[1:]), docs):
            wrong.append(f"docs: no `sprite-os {command}`")
    assert wrong == []


def test_tests_readme_names_every_marker_and_counts_its_rules() -> None:
    import tomllib

    page = (REPO / "tests" / "README.md").read_text()
    markers = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    assert [m.split(":")[0] for m in markers if f"`{m.split(':')[0]}`" not in page] == []
    rules = re.findall(r"^(\d+)\. \*\*", page, re.M)
    number = re.search(r"\b(\w+) rules:", page)
    words = ("zero one two three four five six seven eight nine ten").split()
    assert number is not None and words.index(number[1].lower()) == len(rules) == int(rules[-1])


def test_the_benchmarks_a_page_names_are_there() -> None:
    """`python -m bench --only NAME...` names benchmarks bench/__main__.py runs, and `bench/x.py: fn`
    a function of that file: a renamed benchmark makes this fail until the page says the new name."""
    import ast

    main = ast.parse((REPO / "bench" / "__main__.py").read_text())
    table = next(node.value for fn in main.body if isinstance(fn, ast.FunctionDef) and fn.name == "_benchmarks"
                 for node in fn.body if isinstance(node, ast.Return))  # reading it, not importing every benchmark
    assert isinstance(table, ast.Dict)
    benches = {key.value for key in table.keys if isinstance(key, ast.Constant)}
    text = " ".join(page.read_text() for page in PAGES)
    named = {name for run in re.findall(r"bench --only ((?:[a-z_]+ ?)+)", text) for name in run.split()}
    assert named and sorted(named - benches) == []
    functions = re.findall(r"`(bench/[\w/]+\.py): (\w+)`", text)
    assert functions and [f"{module}: {name}" for module, name in functions if not re.search(
        rf"^(?:async )?def {name}\b", (REPO / module).read_text(), re.M)] == []


def test_what_memory_tells_operators_about_the_set_aside_listing_and_memory_status_is_documented() -> None:
    """`set_aside_listing_failed` was logged on an unreadable folder and `memory status --json` gained
    `recall.server_import`, neither said anywhere an operator reads."""
    source = (REPO / "os_src/memory/system.py").read_text()
    events = set(re.findall(r'"(set_aside_listing_\w+)"', source))
    assert events >= {"set_aside_listing_slow", "set_aside_listing_failed"}
    protocol = (REPO / "docs/protocol.md").read_text()
    assert sorted(e for e in events if f"`{e}`" not in protocol) == []
    memory = (REPO / "docs/memory.md").read_text()
    fields = set(re.findall(r'"(\w+)":', (REPO / "os_src/commands/memory_status.py").read_text().split(
        "def server_import", 1)[1].split("\ndef ", 1)[0]))
    assert "`recall.server_import`" in memory and fields >= {"holder", "answered", "import"}
    assert sorted(f for f in fields if f'"{f}"' not in memory) == []
