"""Dev mode (`make run`), its demo curator and demo model, and the one template installer.

The demo curator's replies are read by the real parser, from prompts the real prompt builder
makes; the demo model reads boot prompts the real loader assembles. The end-to-end test is a
newcomer's first minute: `make run`'s dev mode, then `sprite-os chat`, the real Claude Code CLI between.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anthropic
import pytest

from devkit import dev_mode as command
from devkit.mock_bridge import MockBridge
from devkit.mock_bridge.demo import SEARCH_MEMORY, UNKNOWN, respond
from devkit.mock_bridge.demo_curator import curate
from devkit.mock_bridge.profile import Profile
from devkit.mock_bridge.script import AgentScript, Ids, Plan, ToolUse
from devkit.processes import free_port, kit_env
from sprite_os.commands import main
from sprite_os.config import Settings
from sprite_os.errors import ConfigError
from sprite_os.memory.curation.curator import build_prompt
from sprite_os.memory.curation.reply import parse_reply
from sprite_os.memory.files import SPECS, MemoryFiles, install_templates
from sprite_os.memory.loader import assemble
from sprite_os.memory.memory_store import MemoryDB
from sprite_os.memory.transcript_store import Observation
from sprite_os.paths import Layout

REPO = Path(__file__).resolve().parents[1]
TEMPLATES = REPO / "bootstrap" / "templates"
TEMPLATE_USER_MD = (TEMPLATES / "user.md").read_text()


# ---------------------------------------------------------------- the demo curator


def said(*texts: str, first: int = 1) -> list[Observation]:
    return [Observation(id=n, timestamp=1_790_000_000.0, session_id="s", sequence_num=n, user_message=text,
                        tool_calls_json="[]", agent_response=f"You said: {text}")
            for n, text in enumerate(texts, first)]


def curated(user_md: str, *texts: str, first: int = 1) -> tuple[list[tuple[str, str, int | None]], str | None]:
    """The learnings and the new user.md, as the real parser reads the demo curator's reply."""
    observations = said(*texts, first=first)
    text = curate(build_prompt({"user.md": user_md, "soul.md": "Be kind."}, observations))
    reply = parse_reply(text, [o.id for o in observations])
    assert reply.recognised and not reply.ignored and not reply.rejected_files
    assert set(reply.file_updates) <= {"user.md"}
    learnings = [(x.type, x.content, x.source_observation_id) for x in reply.learnings]
    return learnings, reply.file_updates.get("user.md")


def test_plain_statements_become_learnings_and_user_md() -> None:
    learnings, user_md = curated(TEMPLATE_USER_MD, "My name is Dana and I live in Lisbon",
                                 "What is my name?", "Hi, I prefer tea over coffee. Remember that my sister is Ana!")
    assert learnings == [
        ("FACT", "The user's name is Dana.", 1), ("FACT", "The user lives in Lisbon.", 1),
        ("PREFERENCE", "The user prefers tea over coffee.", 3), ("FACT", "The user's sister is Ana.", 3)]
    assert user_md == ("# Who you are working with\n\n- Name: Dana\n- Lives in: Lisbon\n- Prefers: tea over coffee\n"
                       "- Note: the user's sister is Ana\n")  # the template's placeholder is gone


@pytest.mark.parametrize(("text", "learning"), [
    ("call me Dee", ("FACT", "The user's name is Dee.")),
    ("I'm based in Porto.", ("FACT", "The user lives in Porto.")),
    ("I am from Brazil", ("FACT", "The user is from Brazil.")),
    ("I work as a nurse", ("FACT", "The user works as a nurse.")),
    ("so I work at the city hospital", ("FACT", "The user works at the city hospital.")),
    ("I really like jazz", ("PREFERENCE", "The user likes jazz.")),
    ("I don't like loud music", ("PREFERENCE", "The user does not like loud music.")),
    ("My favourite colour is green", ("FACT", "The user's favourite colour is green.")),
    ("please remember that I have a dentist appointment on Friday",
     ("FACT", "The user has a dentist appointment on Friday.")),
])
def test_each_kind_of_statement(text: str, learning: tuple[str, str]) -> None:
    learnings, user_md = curated("", text)
    assert learnings == [(*learning, 1)]
    assert user_md is not None and user_md.startswith("# Who you are working with\n")


def test_nothing_stated_or_nothing_new_is_none() -> None:
    prompt = build_prompt({}, said("What is my name?", "card: Groceries", "search: tea", "hello"))
    assert curate(prompt) == "NONE" and parse_reply("NONE", [1]).said_none
    known = "# Who you are working with\n\n- Name: Dana\n"
    assert curate(build_prompt({"user.md": known}, said("my name is dana."))) == "NONE"  # the file says it


def test_a_later_value_replaces_the_earlier_one_as_a_correction() -> None:
    person = "# Who you are working with\n\nA person's own paragraph.\n\n- Name: Dana\n- Likes: tea\n"
    learnings, user_md = curated(person, "Actually my name is Daniela", "I like jazz", first=7)
    assert learnings == [("CORRECTION", "The user's name is Daniela, not Dana.", 7),
                         ("PREFERENCE", "The user likes jazz.", 8)]  # likes add up; a name replaces
    assert user_md == ("# Who you are working with\n\nA person's own paragraph.\n\n- Name: Daniela\n- Likes: tea\n"
                       "- Likes: jazz\n")
    # Within one batch too: the last word wins.
    learnings, user_md = curated("", "My name is Dana", "No, my name is Dina")
    assert [x[0] for x in learnings] == ["FACT", "CORRECTION"] and user_md is not None
    assert Profile(user_md).values("Name") == ["Dina"]


async def test_the_demo_curator_answers_only_in_dev_mode_and_never_over_a_script() -> None:
    prompt = build_prompt({}, said("My name is Dana"))
    messages: Any = [{"role": "user", "content": prompt}]
    async with MockBridge() as plain, MockBridge(demo_curator=True) as dev:
        for bridge, expected in ((plain, "NONE"), (dev, curate(prompt))):
            async with anthropic.AsyncAnthropic(base_url=bridge.url, api_key="x", max_retries=0) as client:
                reply = await client.messages.create(model="m", max_tokens=100, messages=messages)
                assert reply.content[0].text == expected  # type: ignore[union-attr]
                bridge.curator.script("FACT: scripted")
                reply = await client.messages.create(model="m", max_tokens=100, messages=messages)
                assert reply.content[0].text == "FACT: scripted"  # type: ignore[union-attr]
        assert "USER_MD_UPDATE:\n# Who you are working with\n\n- Name: Dana" in curate(prompt)


# ---------------------------------------------------------------- the demo model


def boot_prompt(user_md: str) -> str:
    return assemble({"soul.md": "Be kind.", "user.md": user_md}, [], [])


DANA = boot_prompt("# Who you are working with\n\n- Name: Dana\n- Lives in: Lisbon\n- Likes: tea\n- Likes: jazz\n"
                   "\n## Family\n- Sister: Ana\n")


def ask(prompt: str, system: str = DANA, tools: tuple[str, ...] = (SEARCH_MEMORY,)) -> tuple[AgentScript, Plan]:
    agent = AgentScript(Ids(), respond)
    return agent, respond(agent, prompt, list(tools), system)


@pytest.mark.parametrize(("prompt", "reply"), [
    ("What is my name?", "Your name is Dana."),
    ("what's my name", "Your name is Dana."),
    ("Where do I live?", "You live in Lisbon."),
    ("What do I like?", "You like tea and jazz."),
    ("What is my sister?", "Your sister is Ana."),  # under a heading of the person's own
    ("What do you know about me?",
     "What I know about you: Your name is Dana. You live in Lisbon. You like tea. You like jazz. Your sister is Ana."),
    ("My name is Dana", "You said: My name is Dana"),  # a statement is for the curator, not an answer
    ("what was the word?", "You said: what was the word?"),
])
def test_the_demo_model_answers_from_its_boot_prompt(prompt: str, reply: str) -> None:
    _, plan = ask(prompt)
    assert plan.reply.text == reply and plan.reply.stop_reason == "end_turn"


def test_what_the_boot_prompt_does_not_say_comes_from_search_memory() -> None:
    agent, plan = ask("Where do I work?", boot_prompt(TEMPLATE_USER_MD))
    [call] = plan.reply.blocks
    assert isinstance(call, ToolUse) and call.name == SEARCH_MEMORY and call.input == {"query": "Works at"}
    plan.commit()
    found = "1 memories, best match first:\n1. [FACT, 2026-01-01] The user works at the city hospital."
    result = {"type": "tool_result", "tool_use_id": call.id, "content": found}
    after = agent.plan({"messages": [{"role": "user", "content": [result]}]}, [SEARCH_MEMORY])
    assert after.reply.text == f'My notes don\'t say, but memory search for "Works at" returned: {found}'
    # Without the tool, or with nothing remembered about the person at all: it says it doesn't know.
    assert ask("Where do I work?", boot_prompt(TEMPLATE_USER_MD), tools=())[1].reply.text == UNKNOWN
    assert ask("What do you know about me?", boot_prompt(""))[1].reply.text == UNKNOWN


def test_what_do_you_remember_searches_memory() -> None:
    _, plan = ask("What do you remember about Lisbon?")
    [call] = plan.reply.blocks
    assert isinstance(call, ToolUse) and call.input == {"query": "Lisbon"}
    _, plan = ask("search: Dana")  # the demo's command, as before
    assert isinstance(plan.reply.blocks[0], ToolUse) and plan.reply.blocks[0].input == {"query": "Dana"}


# ---------------------------------------------------------------- dev mode's command


@pytest.fixture
def dev_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[Settings]:
    """What dev mode would serve with: its settings, recorded instead of serving."""
    for name in [n for n in os.environ if n.startswith(("SPRITE_", "ANTHROPIC_"))]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    seen: list[Settings] = []
    monkeypatch.setattr(command, "dev_main", lambda settings: seen.append(settings) or 0)
    return seen


def test_dev_honours_the_environment_and_flags(dev_settings: list[Settings], monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    assert command.main([]) == 0
    assert dev_settings[-1].workspace == Path(".workspace") and dev_settings[-1].memory_batch_turns == 3
    monkeypatch.setenv("SPRITE_WORKSPACE", str(tmp_path / "mine"))
    monkeypatch.setenv("SPRITE_MEMORY_BATCH_TURNS", "7")
    monkeypatch.setenv("SPRITE_OS_PORT", "9100")
    assert command.main([]) == 0
    assert (dev_settings[-1].workspace, dev_settings[-1].memory_batch_turns, dev_settings[-1].port) == (
        tmp_path / "mine", 7, 9100)
    assert command.main(["--workspace", "flagged", "--port", "9200", "--host", "0.0.0.0"]) == 0
    assert (dev_settings[-1].workspace, dev_settings[-1].port, dev_settings[-1].host) == (
        Path("flagged"), 9200, "0.0.0.0")
    monkeypatch.setenv("SPRITE_WORKSPACE", " ")  # empty counts as unset, as everywhere
    assert command.main([]) == 0 and dev_settings[-1].workspace == Path(".workspace")
    monkeypatch.setenv("SPRITE_MEMORY_BATCH_TURNS", "many")
    assert command.main([]) == 2 and len(dev_settings) == 4  # a bad setting still fails at once
    # `serve` keeps its own defaults.
    monkeypatch.delenv("SPRITE_MEMORY_BATCH_TURNS")
    monkeypatch.setattr(main, "_serve", lambda settings: dev_settings.append(settings) or 0)
    assert main.main(["serve"]) == 0 and dev_settings[-1].workspace == Path("/workspace")
    assert dev_settings[-1].memory_batch_turns == 25


def test_the_product_command_has_no_dev_mode_and_never_imports_the_kit() -> None:
    """A Sprite runs `sprite-os` from .os/src, where devkit/ is not deployed: no path of it may need it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPRITE_", "ANTHROPIC_"))}
    probe = ("import sys\nfrom sprite_os.commands.main import main\ntry:\n    main(['dev', '--port', '70000'])\n"
             "finally:\n    print(sorted(m for m in sys.modules if m.split('.')[0] == 'devkit'))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 2 and "invalid choice: 'dev'" in done.stderr  # argparse's refusal
    assert done.stdout == "[]\n"
    # Dev mode is the checkout's, run from it (`make run`): the installed package has no command for it
    # (asked of the package's metadata: a venv made before this may still hold an old script).
    commands = [e.name for e in importlib.metadata.distribution("sprite-os").entry_points
                if e.group == "console_scripts"]
    assert commands == ["sprite-os"]


def test_make_run_runs_dev_mode_from_the_checkout_and_leaves_it_the_workspace() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}  # under `make test`
    recipe = subprocess.run(["make", "--no-print-directory", "-n", "run"], cwd=REPO, capture_output=True,
                            text=True, check=True, env=env).stdout.strip().splitlines()[-1]
    assert recipe == ".venv/bin/python -m devkit.dev_mode"  # make runs it in the checkout's root


def test_without_the_dev_extra_dev_mode_says_how_to_install_it(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPRITE_", "ANTHROPIC_"))}
    blocked = ("import sys; sys.modules['aiohttp'] = None; from devkit.dev_mode import main; "
               f"raise SystemExit(main(['--workspace', {str(tmp_path / 'ws')!r}]))")
    done = subprocess.run([sys.executable, "-c", blocked], capture_output=True, text=True, env=kit_env(env),
                          timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("sprite-os: error: dev mode's mock model needs ")
    assert "pip install -e '.[dev]'" in done.stderr and "ANTHROPIC_BASE_URL" in done.stderr
    assert not (tmp_path / "ws").exists()  # refused before touching anything


def test_dev_mode_takes_the_sandbox_or_none_and_user_isolation_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Once the host has an agent's user, `auto` would take `user` and give ./.workspace to it: dev
    mode never asks for `auto` unless told to."""
    from sprite_os.isolation import probe

    monkeypatch.setattr(probe, "sandbox_problem", lambda: None)
    assert command.dev_environment({"SPRITE_AGENT_USER": "sprite-agent"})["SPRITE_ISOLATION"] == "sandbox"
    monkeypatch.setattr(probe, "sandbox_problem", lambda: "bwrap not installed")
    assert command.dev_environment({})["SPRITE_ISOLATION"] == "none"
    for asked in ("user", "auto", "sandbox"):
        assert command.dev_environment({"SPRITE_ISOLATION": asked})["SPRITE_ISOLATION"] == asked


@pytest.mark.parametrize(("mode", "asked", "says"), [
    ("sandbox", None, "sandbox (dev mode's choice, which changes no owner in the workspace)"),
    ("sandbox", "sandbox", "sandbox (SPRITE_ISOLATION=sandbox)"),
    ("none", None, "none -- NOT ISOLATED (the CLI's sandbox cannot run: bwrap not installed)"),
    ("user", "user", "user (SPRITE_ISOLATION=user, as agent7): /tmp/ws is now root:agent7, mode 1770"),
])
def test_the_banner_says_the_isolation_why_and_what_it_changed(monkeypatch: pytest.MonkeyPatch, mode: str,
                                                               asked: str | None, says: str) -> None:
    from types import SimpleNamespace

    from sprite_os.isolation import probe
    from sprite_os.isolation.policy import AgentUser, Isolation

    monkeypatch.setattr(probe, "sandbox_problem", lambda: "bwrap not installed")
    user = AgentUser("agent7", 4000, 4000, Path("/var/lib/agent7")) if mode == "user" else None
    isolation = Isolation(mode, user, f"SPRITE_ISOLATION={mode}" + (", as agent7" if user else ""))  # type: ignore[arg-type]
    app = SimpleNamespace(launch=SimpleNamespace(isolation=isolation), settings=Settings(workspace=Path("/tmp/ws")))
    line = command.isolation_line(app, asked)  # type: ignore[arg-type]
    assert line.startswith(says), line
    assert f"  isolation  {line}\n" in command.banner(Settings(), 1, "t", None, line)


def test_the_banner_says_where_with_what_and_how_to_talk() -> None:
    settings = Settings(workspace=Path("/tmp/my ws"), memory_batch_turns=3)
    text = command.banner(settings, 8765, "tok-0123456789abcdef", "http://127.0.0.1:4000")
    assert "serving on ws://127.0.0.1:8765" in text and "token      tok-0123456789abcdef" in text
    assert "embedded mock Bridge at http://127.0.0.1:4000" in text and "every 3 turns" in text
    assert re.search(r"talk       SPRITE_WORKSPACE='/tmp/my ws' .+ chat --url ws://127.0.0.1:8765", text)
    proxied = command.banner(settings.with_overrides(anthropic_base_url="https://proxy.example"), 1, "t", None)
    assert "the proxy at https://proxy.example" in proxied


# ---------------------------------------------------------------- one template installer


def test_one_function_installs_templates(tmp_path: Path) -> None:
    layout = Layout(tmp_path / "ws")
    assert install_templates(layout, TEMPLATES, "deploy-1") == list(SPECS)
    files = MemoryFiles(layout)
    files.write("user.md", "- Name: Dana\n", "batch-1")
    (layout.memory_dir / "soul.md").write_text("a person's edit\n")
    assert install_templates(layout, TEMPLATES, "deploy-2") == ["soul.md"]  # curated files are never replaced
    assert files.read("user.md") == "- Name: Dana\n"
    assert [v.source for v in files.history("soul.md")] == ["deploy-1", "on-disk", "deploy-2"]
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in SPECS:
        (broken / name).write_text("x\n" * (1 if name != "user.md" else 500))
    with pytest.raises(ConfigError, match=r"template user\.md: user\.md would have 500 lines"):
        install_templates(Layout(tmp_path / "other"), broken, "deploy-3")
    (broken / "user.md").unlink()
    with pytest.raises(ConfigError, match="missing or unreadable"):
        install_templates(Layout(tmp_path / "other"), broken, "deploy-3")
    assert not (tmp_path / "other").exists()  # a broken release writes nothing


# ---------------------------------------------------------------- a newcomer's first minute: the README's


README = REPO / "README.md"
# What differs from run to run: session ids, dates, durations, costs (the turn's, the session's), how many
# memories a search found (the indexer may or may not have caught up with the last turn) and their numbers.
VARIABLE = [(re.compile(r"\d{8}T\d{6}-[0-9a-f]{6}"), "<session>"), (re.compile(r"\d{4}-\d\d-\d\d"), "<date>"),
            (re.compile(r"completed in [\d.]+s, \$[\d.]+( \(session \$[\d.]+\))?"), "completed in <s>, $<usd>"),
            (re.compile(r"returned: \d+ memories"), "returned: <n> memories"), (re.compile(r"^\d+\. "), "<n>. ")]


def normal(line: str) -> str:
    line = line.strip()
    for pattern, placeholder in VARIABLE:
        line = pattern.sub(placeholder, line)
    return line


def walkthrough() -> list[tuple[str, list[str]]]:
    """The README's walkthrough: each line the person types (flush left) with what comes back
    (indented; `…` stands for lines left out), as (typed, [expected lines])."""
    text = README.read_text()
    block = text.split("<!-- walkthrough -->", 1)[1].split("```", 2)[1].split("\n", 1)[1]
    steps: list[tuple[str, list[str]]] = []
    for line in block.rstrip().splitlines():
        if not line.startswith(" "):
            steps.append((line, []))
        elif line.strip() != "…":
            steps[-1][1].append(normal(line))
    return steps


async def _read_until(stream: asyncio.StreamReader, marker: str, seen: list[str], timeout: float = 120) -> str:
    async with asyncio.timeout(timeout):
        while True:
            line = (await stream.readline()).decode()
            assert line, f"ended before {marker!r}: {''.join(seen)[-2000:]}"
            seen.append(line)
            if marker in line or marker == normal(line):
                return line


def in_order(expected: list[str], got: list[str]) -> list[str]:
    """The expected lines that are not found, in order, among `got` (normalised)."""
    lines = iter(normal(line) for line in got)
    return [want for want in expected if not any(want == line for line in lines)]


def test_the_walkthrough_is_read_from_the_readme() -> None:
    steps = walkthrough()
    assert [typed for typed, _ in steps] == ["My name is Dana and I live in Lisbon", "/new", "What is my name?",
                                             "search: Dana"]
    assert all(expected for _, expected in steps)  # each says what comes back, which the next test runs


@pytest.mark.e2e
async def test_the_readmes_walkthrough_runs_as_it_says(tmp_path: Path) -> None:
    """`make run` (dev mode), then `sprite-os chat`, the real Claude Code CLI between, dev
    mode's demo model and demo curator: each line of the README's walkthrough is typed, and what it
    shows coming back must come back, in order (ids, dates, times and costs aside)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPRITE_", "ANTHROPIC_"))}
    workspace, port = tmp_path / "ws", free_port()
    env |= {"SPRITE_WORKSPACE": str(workspace), "SPRITE_OS_PORT": str(port)}
    sprite_os = [sys.executable, "-m", "sprite_os"]
    with open(tmp_path / "server.log", "wb") as log:
        server = await asyncio.create_subprocess_exec(sys.executable, "-m", "devkit.dev_mode", env=kit_env(env),
                                                      stdout=asyncio.subprocess.PIPE, stderr=log)
    chat: asyncio.subprocess.Process | None = None
    try:
        assert server.stdout is not None
        banner: list[str] = []
        token = (await _read_until(server.stdout, "token ", banner)).split()[-1]
        talk = (await _read_until(server.stdout, "talk ", banner)).split()
        assert f"SPRITE_WORKSPACE={workspace}" in talk and talk[-1] == f"ws://127.0.0.1:{port}"
        [isolation] = [line for line in banner if line.startswith("  isolation  ")]
        assert "dev mode's choice" in isolation or "the CLI's sandbox cannot run" in isolation, isolation
        st = workspace.stat()  # whatever users the host has, dev mode gave the checkout's folder to no one
        assert (st.st_uid, st.st_mode & 0o7777) == (os.geteuid(), 0o755), oct(st.st_mode)
        assert (workspace / ".os" / "token").read_text().strip() == token

        chat = await asyncio.create_subprocess_exec(*sprite_os, "chat", env=env, stdin=asyncio.subprocess.PIPE,
                                                    stdout=asyncio.subprocess.PIPE)  # no --url: it finds the port
        assert chat.stdin is not None and chat.stdout is not None
        out: list[str] = []
        await _read_until(chat.stdout, "connected to session", out)
        for typed, expected in walkthrough():
            got: list[str] = []
            chat.stdin.write(f"{typed}\n".encode())
            await chat.stdin.drain()
            await _read_until(chat.stdout, expected[-1], got)  # the step's last line
            out += got
            assert in_order(expected, got) == [], "".join(got)
        user_md = (workspace / ".os" / "memory" / "user.md").read_text()
        assert "- Name: Dana\n- Lives in: Lisbon\n" in user_md  # the line the README says to look at
        chat.stdin.write(b"/quit\n")
        await chat.stdin.drain()
        assert await asyncio.wait_for(chat.wait(), 60) == 0
    finally:
        if chat is not None and chat.returncode is None:
            chat.kill()
            await chat.wait()
        server.send_signal(signal.SIGINT)  # Ctrl-C: the server shuts down gracefully
        assert await asyncio.wait_for(server.wait(), 60) == 0
    done = await asyncio.to_thread(subprocess.run, [*sprite_os, "memory", "status", "--json"], env=env,
                                   capture_output=True, text=True, check=True)
    status = json.loads(done.stdout)
    # FACT name, FACT city, and one SUMMARY per session: asking and searching teach nothing
    assert status["totals"]["learnings"] == 4
    db = MemoryDB(workspace / ".os" / "memory" / "memory.db")
    assert sorted(x.type for x in db.all_learnings()) == ["FACT", "FACT", "SUMMARY", "SUMMARY"]
    db.close()
