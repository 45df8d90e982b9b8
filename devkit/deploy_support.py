"""Deploy tooling run from a checkout: the deploy, migration and service tests and
bench/deploy_bench.py share it (benchmarks import nothing from tests/).

- `venv_cache()`: ONE real venv per test session. The first call downloads a wheelhouse for
  bootstrap/requirements.lock (kept across sessions in the pytest cache, keyed by the lock's
  hash), deploys into a fresh workspace with `--wheelhouse` (so pip really installs, offline),
  and keeps that venv as the `--venv-cache` every other deploy copies.
- `make_checkout()`: a copy of this checkout with another VERSION (a "new release").
- `make_v1_workspace()`: a v1 workspace (agent.db + memory/*.md) with realistic data.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sprite_os import procfs
from sprite_os.memory.memory_store import content_key

from .processes import uncovered_env

REPO = Path(__file__).resolve().parents[1]  # the checkout (devkit/ -> the root)
DEPLOY = REPO / "bootstrap" / "deploy.py"
LOCK = REPO / "bootstrap" / "requirements.lock"
# The system interpreter, as Bridge runs it: not this venv's, with no site-packages (-I -S), so a
# deploy that imported anything outside the standard library would fail.
SYSTEM_PYTHON = getattr(sys, "_base_executable", sys.executable)


def lock_hash(lock: Path = LOCK) -> str:
    return hashlib.sha256(lock.read_bytes()).hexdigest()[:16]


def base_env(**extra: str) -> dict[str, str]:
    """The environment of a deploy or a deployed server: none of this one's settings, and, in a test
    run, the agent's user the run made for its deploys (tests/conftest.py), never the default one."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPRITE_", "ANTHROPIC_", "PYTHONPATH"))}
    if user := os.environ.get("SPRITE_TEST_DEPLOY_USER"):
        env["SPRITE_AGENT_USER"] = user
    env.update(extra)
    return env


def deploy_cmd(workspace: Path, *args: str, stdlib_only: bool = False) -> list[str]:
    """deploy.py as Bridge runs it (`stdlib_only`: the system python with no site-packages), or
    with this venv's python and its site-packages, where the suite's coverage follows it."""
    python = [SYSTEM_PYTHON, "-I", "-S"] if stdlib_only else [sys.executable, "-I"]
    return [*python, str(DEPLOY), "--workspace", str(workspace), *args]


def run_deploy(workspace: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 600,
               stdlib_only: bool = False) -> subprocess.CompletedProcess[str]:
    return subprocess.run(deploy_cmd(workspace, *args, stdlib_only=stdlib_only), capture_output=True, text=True,
                          env=env or base_env(), timeout=timeout)


def token_file(directory: Path) -> Path:
    path = directory / "bridge-token"
    path.write_text("t0ken-" + hashlib.sha256(str(directory).encode()).hexdigest()[:24] + "\n")
    return path


# ---------------------------------------------------------------- the one real venv


@dataclass
class VenvCache:
    cache: Path  # --venv-cache DIR: holds <H>/
    wheelhouse: Path
    first_workspace: Path  # the workspace of the real (pip-installing) deploy
    first_output: str
    first_seconds: float


_VENV_CACHE: dict[str, VenvCache] = {}


DOWNLOAD_ATTEMPTS = 3  # the registry is the network: a read timeout mid-download ends pip with status 2


def download(target: Path) -> None:
    """pip download the lock's wheels into `target`, again after a failure; the last failure's
    own words in the error (pip's stderr), not only its status."""
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
               "--no-deps", "--only-binary=:all:", "-r", str(LOCK), "-d", str(target)]
    for attempt in range(1, DOWNLOAD_ATTEMPTS + 1):
        done = subprocess.run(command, capture_output=True, text=True, env=uncovered_env())
        if done.returncode == 0:
            return
        if attempt == DOWNLOAD_ATTEMPTS:
            raise RuntimeError(f"pip download failed {attempt} times (exit {done.returncode}): "
                               f"{done.stderr[-4000:]}")
        time.sleep(5 * attempt)


def wheelhouse(cache_root: Path) -> Path:
    """Wheels for the lock, downloaded once and kept (pip download, through the normal registry)."""
    target = cache_root / f"wheelhouse-{lock_hash()}"
    if not (target / ".complete").exists():
        for old in cache_root.glob("wheelhouse-*"):  # other locks' wheels, and leftovers
            if not old.name.endswith(f".partial-{os.getpid()}"):
                shutil.rmtree(old, ignore_errors=True)
        tmp = cache_root / f"wheelhouse-{lock_hash()}.partial-{os.getpid()}"
        download(tmp)
        (tmp / ".complete").write_text("ok\n")
        try:
            os.rename(tmp, target)
        except OSError:  # another session got there first
            if not (target / ".complete").exists():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def venv_cache(cache_root: Path, tmp_root: Path) -> VenvCache:
    """Build the session's venv once, by a real deploy from the wheelhouse."""
    key = str(tmp_root)
    if key in _VENV_CACHE:
        return _VENV_CACHE[key]
    houses = wheelhouse(cache_root)
    workspace = tmp_root / "first-workspace"
    workspace.mkdir(parents=True)
    started = time.monotonic()
    # The first, real deploy runs as Bridge runs it: the system python, standard library only.
    done = run_deploy(workspace, "--from-checkout", str(REPO), "--wheelhouse", str(houses),
                      "--token-file", str(token_file(tmp_root)), stdlib_only=True)
    seconds = time.monotonic() - started
    assert done.returncode == 0, done.stdout + done.stderr
    cache = tmp_root / "venv-cache"
    cache.mkdir()
    # Hard links: the cache shares the first workspace's files (nothing modifies a venv in place).
    subprocess.run(["cp", "-al", str(workspace / ".os" / "venvs" / lock_hash()), str(cache / lock_hash())],
                   check=True)
    _VENV_CACHE[key] = VenvCache(cache, houses, workspace, done.stdout, seconds)
    return _VENV_CACHE[key]


def clone_cached_venv(cache: Path, lock: Path) -> None:
    """Make the cache hold a venv for another lock file with the same packages (hard links)."""
    target = cache / lock_hash(lock)
    if not target.exists():
        subprocess.run(["cp", "-al", str(cache / lock_hash()), str(target)], check=True)


# ---------------------------------------------------------------- checkouts of other versions


def make_checkout(root: Path, version: str, *, lock_comment: str | None = None,
                  template_note: str | None = None) -> Path:
    """A copy of this checkout (os_src, bootstrap, VERSION) that says `version`.

    `lock_comment` changes the lock's bytes (a new venv hash, same packages); `template_note`
    appends a line to soul.md and os.md, as a release with new deploy-managed files would."""
    checkout = root / f"checkout-{version}"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "os_src", checkout / "os_src", ignore=ignore)
    shutil.copytree(REPO / "bootstrap", checkout / "bootstrap", ignore=ignore)
    (checkout / "VERSION").write_text(version + "\n")
    if lock_comment:
        lock = checkout / "bootstrap" / "requirements.lock"
        lock.write_text(lock.read_text() + f"# {lock_comment}\n")
    if template_note:
        for name in ("soul.md", "os.md"):
            path = checkout / "bootstrap" / "templates" / name
            path.write_text(path.read_text() + f"\n{template_note}\n")
    return checkout


# ---------------------------------------------------------------- processes


def run_until(cmd: list[str], marker: str, *, env: dict[str, str], timeout: float = 120) -> tuple[bool, str]:
    """Run `cmd` in its own process group and SIGKILL the group as soon as a line of its output
    contains `marker` (or after `timeout` seconds, or when it ends). Returns (killed at the
    marker, output so far)."""
    return asyncio.run(_run_until(cmd, marker, env, timeout))


async def _run_until(cmd: list[str], marker: str, env: dict[str, str], timeout: float) -> tuple[bool, str]:
    proc = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
                                                env=env, start_new_session=True)
    assert proc.stdout is not None
    lines: list[str] = []
    killed = False
    try:
        # A read, not a poll: the deadline also ends a run that stops printing.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                async for raw in proc.stdout:
                    lines.append(raw.decode())
                    if marker in lines[-1]:
                        killed = True
                        break
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
    return killed, "".join(lines)


def processes_in_session(sid: int) -> list[int]:
    """Live processes of the session `sid`."""
    return [pid for pid in procfs.pids() if (st := procfs.stat(pid)) is not None and st.sid == sid and st.alive]


def healthz(port: int, workspace: Path | None = None, timeout: float = 2.0) -> dict[str, Any] | None:
    """/healthz; with `workspace`, presenting its token (.os/token), as `service status` does."""
    import http.client

    headers = {"Authorization": f"Bearer {(workspace / '.os' / 'token').read_text().strip()}"} if workspace else {}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", "/healthz", headers=headers)
        response = conn.getresponse()
        return json.loads(response.read()) if response.status == 200 else None
    except OSError:
        return None
    finally:
        conn.close()


def snapshot(root: Path, skip: tuple[str, ...] = ()) -> dict[str, tuple[int, int, int]]:
    """(inode, mtime_ns, size) of every path under `root`, symlinks not followed."""
    out = {}
    for folder, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = Path(folder) / name
            rel = str(path.relative_to(root))
            if rel.startswith(skip):
                continue
            st = path.lstat()
            out[rel] = (st.st_ino, st.st_mtime_ns, st.st_size)
    return out


# ---------------------------------------------------------------- v1 workspaces

V1_SCHEMA = """
CREATE TABLE observations (
    id INTEGER PRIMARY KEY AUTOINCREMENT, timestamp REAL, session_id TEXT, sequence_num INTEGER,
    user_message TEXT, tool_calls_json TEXT, agent_response TEXT, processed INTEGER DEFAULT 0);
CREATE TABLE learnings (
    id INTEGER PRIMARY KEY AUTOINCREMENT, created_at REAL, session_id TEXT, type TEXT, content TEXT,
    source_observation_id INTEGER, confidence REAL);
CREATE TABLE pending_actions (
    id INTEGER PRIMARY KEY AUTOINCREMENT, created_at REAL, content TEXT, priority INTEGER DEFAULT 0,
    status TEXT DEFAULT 'pending', source_learning_id INTEGER);
CREATE TABLE sessions (
    id TEXT PRIMARY KEY, started_at REAL, ended_at REAL, message_count INTEGER DEFAULT 0,
    observation_count INTEGER DEFAULT 0);
CREATE VIRTUAL TABLE learnings_fts USING fts5(content, type, content='learnings', content_rowid='id');
CREATE TRIGGER learnings_ai AFTER INSERT ON learnings BEGIN
    INSERT INTO learnings_fts(rowid, content, type) VALUES (new.id, new.content, new.type); END;
"""

V1_FILES = {
    "os.md": "# Sprite (v1)\n\nYou are a helpful agent. Old system rules that v2 replaces.\n",
    "tools.md": "# Tools\n\n- `pdftotext` is installed (apt) and works for scanned invoices after OCR.\n"
                "- The user's printer is reachable as `lp -d office`.\n",
    "user.md": "# User\n\nName: Zoë Müller. Prefers dates as DD/MM/YYYY. Works on invoices for 🌿 GreenLeaf Ltd.\n"
               "Likes short answers.\n",
}

WORDS = ("invoice receipt contract report summary table chart ocr extract folder client supplier total "
         "amount date tax vat payment due overdue draft final review approve send archive scan page "
         "line item currency euro pound dollar quarter month year budget forecast note reminder").split()
TOOLS = ("Read", "Write", "Bash", "Edit", "mcp__canvas__create_card", "mcp__canvas__update_card")
TYPES = ("FACT", "PATTERN", "CORRECTION", "PREFERENCE", "ACTION", "TOOL_INSTALL")


@dataclass
class V1Data:
    root: Path
    counts: dict[str, int]
    repeated_turns: list[int] = field(default_factory=list)  # ids whose (session, seq) repeats an earlier row
    key_collisions: dict[str, list[int]] = field(default_factory=dict)  # table -> ids that collide on content_key


_POOL = random.Random(0).choices(WORDS, k=50_000)


def _sentence(rng: random.Random, n: int) -> str:
    start = rng.randrange(len(_POOL) - n)
    return " ".join(_POOL[start:start + n]).capitalize() + "."


def make_v1_workspace(root: Path, *, observations: int = 3000, learnings: int = 800, actions: int = 120,
                      seed: int = 7, turns_per_session: int = 20, wal: bool = True) -> V1Data:
    """A v1 workspace as the flat v1 server left it: W/agent.db and W/memory/*.md.

    Realistic in shape and size: sessions of ~20 turns, tool calls as JSON (~1-2 KB per turn),
    learnings of every type with duplicates (exact, and differing only in case and end
    punctuation, which collide on content_key), pending actions with duplicates, a few turns
    recorded twice (same session and sequence number), unicode, NULLs where v1 allowed them."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(root / "agent.db")
    if wal:
        db.execute("PRAGMA journal_mode=WAL")
    db.executescript(V1_SCHEMA)
    base = 1_700_000_000.0
    sessions: list[tuple[Any, ...]] = []
    rows: list[tuple[Any, ...]] = []
    repeated: list[int] = []
    n_sessions = max(1, observations // turns_per_session)
    for s in range(n_sessions):
        sid = f"sess-{s:05d}-{rng.randrange(16**6):06x}"
        start = base + s * 3600
        n = turns_per_session if s < n_sessions - 1 else observations - len(rows)
        for seq in range(n):
            calls = [{"tool": rng.choice(TOOLS), "input": {"path": f"documents/{rng.choice(WORDS)}-{seq}.pdf"},
                      "summary": _sentence(rng, rng.randint(8, 30))} for _ in range(rng.randint(0, 4))]
            user = _sentence(rng, rng.randint(5, 40))
            if rng.random() < 0.01:
                user += " — naïve café ✓ 日本語 🌿"
            rows.append((start + seq * 30 + rng.random(), sid, seq, user, json.dumps(calls),
                         _sentence(rng, rng.randint(20, 120)), rng.choice((0, 1, 1, 1, 2))))
        ended = None if rng.random() < 0.1 else start + n * 30
        sessions.append((sid, start, ended, n * 2, n))
    # A few turns recorded twice (the v1 Stop hook and ResultMessage both wrote them).
    for i in rng.sample(range(len(rows)), k=min(5, len(rows))):
        rows.append(rows[i])
    db.executemany("""INSERT INTO observations (timestamp, session_id, sequence_num, user_message, tool_calls_json,
                      agent_response, processed) VALUES (?, ?, ?, ?, ?, ?, ?)""", rows)
    first: dict[tuple[str, int], int] = {}
    for oid, sid, seq in db.execute("SELECT id, session_id, sequence_num FROM observations ORDER BY id"):
        if (sid, seq) in first:
            repeated.append(oid)
        else:
            first[(sid, seq)] = oid
    db.executemany("INSERT INTO sessions VALUES (?, ?, ?, ?, ?)", sessions)

    contents: list[str] = []
    lrows = []
    for i in range(learnings):
        roll = rng.random()
        if contents and roll < 0.04:
            text = rng.choice(contents)  # exact duplicate
        elif contents and roll < 0.08:
            text = rng.choice(contents).upper().rstrip(".") + "!"  # same content_key, different text
        else:
            text = f"{_sentence(rng, rng.randint(6, 25))} (#{i})"
            contents.append(text)
        obs = rng.randrange(1, observations + 1) if rng.random() < 0.9 else None
        sess = sessions[rng.randrange(len(sessions))][0] if rng.random() < 0.9 else None
        lrows.append((base + i * 60, sess, rng.choice(TYPES), text, obs, round(rng.uniform(0.3, 1.0), 3)))
    db.executemany("""INSERT INTO learnings (created_at, session_id, type, content, source_observation_id,
                      confidence) VALUES (?, ?, ?, ?, ?, ?)""", lrows)
    arows: list[tuple[Any, ...]] = []
    for i in range(actions):
        if i >= 10 and rng.random() < 0.05:
            text = arows[rng.randrange(len(arows))][1]  # the same action extracted twice
        else:
            text = f"Remind the user about the {rng.choice(WORDS)} {rng.choice(WORDS)} (#{i})."
        arows.append((base + i * 600, text, rng.randint(0, 3), rng.choice(("pending", "completed", "dismissed")),
                      rng.randrange(1, learnings + 1) if learnings and rng.random() < 0.8 else None))
    db.executemany("""INSERT INTO pending_actions (created_at, content, priority, status, source_learning_id)
                      VALUES (?, ?, ?, ?, ?)""", arows)
    db.commit()
    collisions: dict[str, list[int]] = {}
    for table in ("learnings", "pending_actions"):
        seen: set[str] = set()
        for rid, text in db.execute(f"SELECT id, content FROM {table} ORDER BY id"):
            key = content_key(text)
            if key in seen:
                collisions.setdefault(table, []).append(rid)
            seen.add(key)
    counts = {t: db.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
              for t in ("observations", "sessions", "learnings", "pending_actions")}
    db.close()
    memory = root / "memory"
    memory.mkdir(exist_ok=True)
    for name, text in V1_FILES.items():
        (memory / name).write_text(text, encoding="utf-8")
    return V1Data(root, counts, repeated, collisions)


def table_rows(db: Path, table: str, columns: str = "*") -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute(f"SELECT {columns} FROM {table} ORDER BY id").fetchall()
    finally:
        conn.close()

