"""bootstrap/deploy.py and build_release.py: fresh deploys, lazy redeploys, new versions, killed
deploys, rollback, v1 migration on deploy, and a real turn through a deployed server."""

from __future__ import annotations

import ast
import asyncio
import csv
import fcntl
import hashlib
import importlib.util
import io
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from websockets.asyncio.client import connect

from devkit.deploy_support import (
    DEPLOY,
    LOCK,
    REPO,
    V1_FILES,
    VenvCache,
    base_env,
    clone_cached_venv,
    deploy_cmd,
    healthz,
    lock_hash,
    make_checkout,
    make_v1_workspace,
    processes_in_session,
    run_deploy,
    run_until,
    snapshot,
    token_file,
    venv_cache,
)
from devkit.processes import free_port
from sprite_os.commands.migrate_v1 import ROWS_PER_COMMIT

VERSION = (REPO / "VERSION").read_text().strip()
MANIFEST_NAME = "MANIFEST"
TEMPLATES = REPO / "bootstrap" / "templates"
CURATED = ("tools.md", "files.md", "user.md", "context.md")


def load_script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"bootstrap_{name}", REPO / "bootstrap" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(REPO / "bootstrap"))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(REPO / "bootstrap"))
    return module


@pytest.fixture(scope="session")
def venv(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> VenvCache:
    """The session's one real venv: a deploy that pip-installs the lock from a wheelhouse."""
    cache_root = Path(request.config.cache.mkdir("sprite-os-deploy"))
    return venv_cache(cache_root, tmp_path_factory.mktemp("deploy-session"))


def deploy_ok(workspace: Path, venv: VenvCache, *args: str, env: dict[str, str] | None = None,
              links: bool = True) -> str:
    """Deploy with the session's venv cache: hard-linked (fast), or copied as by default."""
    cache = ("--venv-cache", str(venv.cache), *(["--venv-cache-links"] if links else []))
    done = run_deploy(workspace, *args, *cache, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def current(workspace: Path) -> str:
    return os.readlink(workspace / ".os" / "current")


def sprite_os(workspace: Path, *args: str, env: dict[str, str] | None = None,
              timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(workspace / ".os" / "bin" / "sprite-os"), *args], capture_output=True, text=True,
                          env=env or base_env(), timeout=timeout, cwd=workspace)


@pytest.fixture
def service_env() -> Iterator[dict[str, str]]:
    # The workspace is under pytest's tmp (0700), where the agent's user cannot reach: a deployed
    # Sprite would refuse to start rather than run weaker in silence, so the weaker mode is named.
    yield base_env(SPRITE_OS_PORT=str(free_port()), ANTHROPIC_BASE_URL="http://127.0.0.1:9", SPRITE_ISOLATION="sandbox")


def stop_and_check(workspace: Path, env: dict[str, str]) -> None:
    """Stop the service; nothing it started may be left."""
    pid_file = workspace / ".os" / "state" / "server.pid"
    pid = int(pid_file.read_text()) if pid_file.exists() else None
    done = sprite_os(workspace, "service", "stop", env=env)
    assert done.returncode == 0, done.stderr
    assert not pid_file.exists()
    if pid is not None:
        assert processes_in_session(pid) == []


# ---------------------------------------------------------------- fresh deploy


def test_fresh_deploy_installs_for_real(venv: VenvCache) -> None:
    ws, out = venv.first_workspace, venv.first_output
    steps = [line.split()[1] for line in out.splitlines() if line.startswith("deploy: step=")]
    made_user = ("agent-user",) if os.geteuid() == 0 else ()  # as root: before anything switches
    assert steps == [f"step={s}" for s in ("stage", *made_user, "venv", "check", "migrate", "templates", "switch", "links",
                                                 "isolate", "restart", "gc")]
    h = lock_hash()
    assert f"deploy: venv={h} built" in out  # pip really installed it, from the wheelhouse, offline
    log = (ws / ".os" / "logs" / "deploy.log").read_text().splitlines()
    pip_line = next(line for line in log if " pip install " in line)
    assert "--no-index" in pip_line and "--only-binary=:all:" in pip_line  # no sdist build offline
    osd = ws / ".os"
    assert current(ws) == f"releases/{VERSION}"
    release = osd / "releases" / VERSION
    assert (release / ".complete").is_file() and os.readlink(release / "venv") == f"../../venvs/{h}"
    assert (osd / "venvs" / h / ".complete").is_file()
    assert (release / "requirements.lock").read_bytes() == LOCK.read_bytes()
    for link, target in ((".os/src", "current/src"), (".os/.venv", "current/venv"), (".os/VERSION", "current/VERSION"),
                         (".os/lib/sprite_os", "../src")):
        assert os.readlink(ws / link) == target
    assert (osd / "VERSION").read_text().strip() == VERSION
    assert os.access(osd / "bin" / "sprite-os", os.X_OK)
    assert oct(osd.stat().st_mode & 0o7777) == "0o711"  # passed through to .os/agent, never listed
    if os.geteuid() == 0:  # the agent's user exists and owns user space; .os/ and the root are root's
        import pwd

        agent = pwd.getpwnam(base_env()["SPRITE_AGENT_USER"])  # the run's own (tests/conftest.py)
        assert (ws.stat().st_uid, ws.stat().st_gid, ws.stat().st_mode & 0o7777) == (0, agent.pw_gid, 0o1770)
        assert (ws / "documents").stat().st_uid == agent.pw_uid
        assert all(p.lstat().st_uid == 0 for p in (osd / "memory").rglob("*"))
        assert (osd / "memory").stat().st_mode & 0o777 == 0o700
    assert oct((osd / "token").stat().st_mode & 0o777) == "0o600"
    for name in ("soul.md", "os.md", *CURATED):
        assert (osd / "memory" / name).read_bytes() == (TEMPLATES / name).read_bytes()
    for name in ("documents", "ocr", "extractions", "artifacts"):
        assert (ws / name).is_dir()
    pth = next((osd / "venvs" / h).glob("lib/python3*/site-packages/sprite_os.pth"))
    assert pth.read_text() == f"{osd / 'lib'}\n"
    # The deployed venv imports sprite_os from the current release, and nothing from this checkout.
    probe = subprocess.run([str(osd / ".venv" / "bin" / "python"), "-c",
                            "import os, sprite_os, importlib.util as u; "
                            "print(os.path.realpath(sprite_os.__file__), sprite_os.__version__, u.find_spec('tests'))"],
                           capture_output=True, text=True, cwd="/", env=base_env(), check=True)
    assert probe.stdout.split() == [str(release / "src" / "__init__.py"), VERSION, "None"]
    assert sprite_os(ws, "version").stdout.strip() == VERSION


# ---------------------------------------------------------------- release tarball, lazy redeploy


def test_release_tarball_deploys_and_same_version_is_a_noop(venv: VenvCache, tmp_path: Path) -> None:
    build = load_script("build_release")
    tarball = build.build(REPO, tmp_path / "dist")
    assert tarball.name == f"sprite-os-{VERSION}.tar.gz"
    again = build.build(REPO, tmp_path / "dist2")
    assert tarball.read_bytes() == again.read_bytes(), "the tarball must be reproducible"
    with tarfile.open(tarball) as tf:
        names = tf.getnames()
    assert names[0] == "VERSION" and "requirements.lock" in names and "src/__init__.py" in names
    assert "bootstrap/deploy.py" in names and "bootstrap/templates/os.md" in names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    assert not [n for n in names if n.split("/")[0] in ("devkit", "tests", "bench", "chaos")]  # the product only

    ws = tmp_path / "ws"
    token = token_file(tmp_path)
    out = deploy_ok(ws, venv, "--release", str(tarball), "--token-file", str(token), links=False)
    assert f"deploy: venv={lock_hash()} copied" in out
    venv_file = next((ws / ".os" / "venvs").glob(f"{lock_hash()}/lib/python3*/site-packages/msgspec/__init__.py"))
    assert venv_file.stat().st_nlink == 1  # a copy, not links into the cache
    assert (ws / ".os" / "token").read_text() == token.read_text()
    before = snapshot(ws)
    done = run_deploy(ws, "--release", str(tarball), "--token-file", str(token), "--venv-cache", str(venv.cache))
    assert done.returncode == 0 and done.stdout == f"deploy: already at {VERSION}\n", done.stdout + done.stderr
    assert snapshot(ws) == before  # nothing touched: same inodes, mtimes, sizes
    # How long it takes (well under a second) is measured by `make bench`, not timed here.


def stand_in_venv(venv: Path, python: str) -> None:
    """A complete venv as far as a deploy looks (`.complete`, `bin/python`, `pyvenv.cfg`), with no pip."""
    (venv / "bin").mkdir(parents=True)
    os.symlink(python, venv / "bin" / "python")
    (venv / "pyvenv.cfg").write_text(f"version = {'.'.join(map(str, sys.version_info[:2]))}.0\n")
    (venv / ".complete").write_text("built\n")


def test_a_release_rebuilt_under_the_deployed_version_is_refused_not_said_deployed(tmp_path: Path) -> None:
    """The no-op path compares MANIFESTs: a tarball rebuilt with other content under the version
    deployed said `already at V` (exit 0) while the old code went on serving. The same release again
    is still the no-op; a checkout is compared as it would be staged. No pip: the venv is a stand-in."""
    deploy = load_script("deploy")
    build = load_script("build_release")
    tarball = build.build(REPO, tmp_path / "dist")
    ws = tmp_path / "ws"
    p = deploy.Paths(ws)
    release = p.releases / VERSION
    release.mkdir(parents=True)
    deploy.Tarball(tarball).stage(release)  # as a deploy of it staged it
    stand_in_venv(p.venvs / lock_hash(), sys.executable)
    os.symlink(f"../../venvs/{lock_hash()}", release / "venv")
    (release / ".complete").write_text(f"{VERSION}\n")
    os.symlink(f"releases/{VERSION}", p.current)
    os.symlink("current/VERSION", p.version)

    assert deploy.main(["--workspace", str(ws), "--release", str(tarball)]) == 0  # the same: nothing to do
    assert deploy.main(["--workspace", str(ws), "--from-checkout", str(REPO)]) == 0
    rebuilt = make_checkout(tmp_path, VERSION)
    with (rebuilt / "os_src" / "server.py").open("a") as f:
        f.write("# a fix, built again under the same version\n")
    other = build.build(rebuilt, tmp_path / "dist2")
    by_hand = repacked(other, tmp_path / "by-hand.tar.gz", manifest_last=True)  # its MANIFEST not among the first
    for source in (["--release", str(other)], ["--release", str(by_hand)], ["--from-checkout", str(rebuilt)]):
        done = run_deploy(ws, *source)
        assert done.returncode == 1 and done.stdout == "", done.stdout + done.stderr
        assert f"this release of {VERSION} is not the {VERSION} deployed (its MANIFEST differs)" in done.stderr
    assert os.readlink(p.current) == f"releases/{VERSION}"


def test_a_rollback_to_a_release_that_cannot_run_is_refused(tmp_path: Path) -> None:
    """The previous release's venv died with the system python it was built on: the rollback switched
    to it all the same, warned that its templates could not be restored, and said done (exit 0) with
    a current release that could not start, nor even run the `sprite-os` that would restart it. The same
    for a venv a file of whose packages is gone (the deploy's venv_damage)."""
    deploy = load_script("deploy")
    ws = tmp_path / "ws"
    p = deploy.Paths(ws)
    now = p.releases / "2.0.0"
    now.mkdir(parents=True)
    deploy.Checkout(REPO).stage(now)  # its deploy.py and facts run the rollback
    stand_in_venv(p.venvs / "now", sys.executable)
    os.symlink("../../venvs/now", now / "venv")
    before = p.releases / "1.0.0"
    before.mkdir()
    stand_in_venv(p.venvs / "before", str(tmp_path / "python3.10-removed-by-an-upgrade"))
    os.symlink("../../venvs/before", before / "venv")
    for release in (now, before):
        (release / ".complete").write_text("\n")
    os.symlink("releases/2.0.0", p.current)
    os.symlink("releases/1.0.0", p.previous)

    done = run_deploy(ws, "--rollback")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "the previous release 1.0.0 cannot run: its venv's python is gone" in done.stderr, done.stderr
    assert (os.readlink(p.current), os.readlink(p.previous)) == ("releases/2.0.0", "releases/1.0.0")

    shutil.rmtree(p.venvs / "before")  # its python runs, but a file of its packages is gone (by hand, a disk error)
    stand_in_venv_with(p.venvs / "before", "pkg/__init__.py", "pkg/mod.py")
    next((p.venvs / "before").glob("lib/python3*/site-packages/pkg/mod.py")).unlink()
    done = run_deploy(ws, "--rollback")
    assert done.returncode == 1, done.stdout + done.stderr
    assert re.search(r"the previous release 1\.0\.0 cannot run: its venv is damaged \(lib/python3\.[0-9]+/"
                     r"site-packages/pkg/mod\.py is missing\); deploy its tarball again", done.stderr), done.stderr
    assert (os.readlink(p.current), os.readlink(p.previous)) == ("releases/2.0.0", "releases/1.0.0")


def test_a_venv_whose_python_is_gone_is_rebuilt(venv: VenvCache, tmp_path: Path) -> None:
    """After a system python upgrade the venv's bin/python dangles: not "already at", and the
    venv is rebuilt (beside it, then renamed over); likewise for a venv of another python version."""
    ws = tmp_path / "ws"
    deploy_ok(ws, venv, "--from-checkout", str(REPO))
    built = ws / ".os" / "venvs" / lock_hash()
    (built / "bin" / "python").unlink()  # an unlink, not a write: the cache shares these inodes
    (built / "bin" / "python").symlink_to("/nonexistent/python3.11")
    out = deploy_ok(ws, venv, "--from-checkout", str(REPO))
    assert "already at" not in out and f"deploy: venv={lock_hash()} is unusable" in out, out
    assert f"deploy: venv={lock_hash()} linked" in out
    assert os.path.exists(built / "bin" / "python") and sprite_os(ws, "version").stdout.strip() == VERSION
    assert run_deploy(ws, "--from-checkout", str(REPO)).stdout == f"deploy: already at {VERSION}\n"

    cfg = built / "pyvenv.cfg"
    stale = cfg.with_name("pyvenv.cfg.new")
    stale.write_text(re.sub(r"(?m)^version\s*=.*$", "version = 3.10.4", cfg.read_text()))
    os.replace(stale, cfg)  # a new file, again not touching the cache's
    out = deploy_ok(ws, venv, "--from-checkout", str(REPO))  # no --force: a python upgrade is not "already at"
    assert "already at" not in out and f"deploy: venv={lock_hash()} is unusable" in out and f"deploy: venv={lock_hash()} linked" in out
    assert "version = 3.10.4" not in cfg.read_text()
    assert not [e.name for e in (ws / ".os" / "venvs").iterdir() if e.name != lock_hash()]


# ---------------------------------------------------------------- new versions, gc, rollback


def release_on_the_lock(deploy: ModuleType, tmp_path: Path) -> tuple[Any, ModuleType, Path]:
    """A workspace's Paths (with the checkout's facts), the facts, and a release 0.9.0 whose venv is the
    checkout's lock's, not made yet: what ensure_venv is given."""
    p = deploy.Paths(tmp_path / "ws")
    contract = deploy.load_contract(REPO / "os_src")
    p.use(contract)
    release = p.releases / "0.9.0"
    release.mkdir(parents=True)
    os.symlink(f"../../venvs/{lock_hash()}", release / "venv")
    return p, contract, release


def stand_in_venv_with(venv: Path, *files: str) -> None:
    """stand_in_venv, with a package whose files its RECORD lists, as pip leaves them."""
    stand_in_venv(venv, sys.executable)
    site = venv / "lib" / f"python{'.'.join(map(str, sys.version_info[:2]))}" / "site-packages"
    for name in files:
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_text("")
    record = site / "pkg-1.0.dist-info" / "RECORD"
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text("".join(f"{name},sha256=x,0\n" for name in files) + "pkg/__pycache__/mod.cpython-311.pyc,,\n"
                      "pkg-1.0.dist-info/RECORD,,\n")


def test_a_damaged_venv_marked_complete_is_rebuilt_not_reused(tmp_path: Path) -> None:
    """A complete venv was reused as long as its python resolved: one damaged since (a package's file
    removed by hand, a disk error) failed the import check of every deploy that shared its lock, each
    refused, until someone removed it. A file its packages' RECORDs list and that is missing is now seen
    (a stat each, 50 to 60 ms for the lock's 11,900 files), and the venv rebuilt beside it: here copied from the
    --venv-cache, no pip. A damaged cache entry is not copied either."""
    deploy = load_script("deploy")
    p, contract, release = release_on_the_lock(deploy, tmp_path)
    files = ("pkg/__init__.py", "pkg/mod.py", "../../../bin/pkg-tool")
    venv, cache = p.venvs / lock_hash(), tmp_path / "cache"
    stand_in_venv_with(venv, *files)
    stand_in_venv_with(cache / lock_hash(), *files)
    site = next(venv.glob("lib/python3*/site-packages"))
    assert deploy.ensure_venv(p, release, contract, None, cache) == (lock_hash(), "reused")  # whole: as it is

    (site / "pkg" / "mod.py").unlink()
    assert deploy.venv_damage(venv) == f"{site.relative_to(venv)}/pkg/mod.py"
    assert deploy.ensure_venv(p, release, contract, None, cache) == (lock_hash(), "copied")
    assert (site / "pkg" / "mod.py").is_file() and deploy.venv_damage(venv) is None
    assert sorted(e.name for e in p.venvs.iterdir()) == [lock_hash()]  # the damaged one swapped out, removed

    (venv / "bin" / "pkg-tool").unlink()
    (cache / lock_hash() / "bin" / "pkg-tool").unlink()
    with pytest.MonkeyPatch.context() as mp:
        built: list[str] = []

        def build(_release: Path, target: Path, _wheelhouse: Path | None) -> str:
            built.append(target.name)
            shutil.copytree(venv, target, symlinks=True)
            (target / "bin" / "pkg-tool").write_text("")
            return "built"
        mp.setattr(deploy, "build_venv", build)
        assert deploy.ensure_venv(p, release, contract, None, cache) == (lock_hash(), "built")
    assert len(built) == 1 and built[0].startswith(f"{lock_hash()}.partial-") and deploy.venv_damage(venv) is None


def test_a_damaged_venv_that_cannot_be_rebuilt_is_used_as_it_is_the_import_check_deciding(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A damaged venv was always rebuilt: on a Sprite with no network, no wheelhouse and no whole cache entry
    the rebuild failed, and every deploy on that lock with it, where one whose missing file nothing needs (a
    bin/ script) went through before. It is used as it is then, said so, the import check deciding; its
    python gone, the failure stands (nothing could run)."""
    deploy = load_script("deploy")
    p, contract, release = release_on_the_lock(deploy, tmp_path)
    venv = p.venvs / lock_hash()
    stand_in_venv_with(venv, "pkg/__init__.py", "../../../bin/pkg-tool")
    (venv / "bin" / "pkg-tool").unlink()
    offline = "pip install failed (exit 1): ERROR: Could not find a version that satisfies the requirement x"

    def build(_release: Path, target: Path, _wheelhouse: Path | None) -> str:
        target.mkdir()
        raise deploy.DeployError(offline)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(deploy, "build_venv", build)
        assert deploy.ensure_venv(p, release, contract, None, None) == (lock_hash(), "reused")
        assert capsys.readouterr().out.splitlines()[-1] == (
            f"deploy: venv={lock_hash()} is damaged (bin/pkg-tool is missing) and could not be rebuilt ({offline}); "
            "using it as it is, the import check decides")
        assert sorted(e.name for e in p.venvs.iterdir()) == [lock_hash()] and (venv / ".complete").is_file()
        assert (next(venv.glob("lib/python3*/site-packages")) / "sprite_os.pth").read_text() == f"{p.lib}\n"

        (venv / "bin" / "python").unlink()  # unusable, not only damaged: nothing could run
        with pytest.raises(deploy.DeployError, match=r"^pip install failed"):
            deploy.ensure_venv(p, release, contract, None, None)


def test_a_whole_venv_is_not_called_damaged_by_its_records_quoting_or_paths_outside_it(tmp_path: Path) -> None:
    """RECORD is CSV: pip quotes a name holding a comma or a quote (`"pkg/a,b.py"`), which the look inside a venv
    read as a name with its quotes and commas, a file that is never there; and a name that leads out of the
    venv (`../` past its root, an absolute path: the host's file, not the venv's) was looked for on the host.
    Either made a whole venv damaged at every deploy (rebuilt each time, minutes of pip) and every rollback
    to its release refused, for good."""
    deploy = load_script("deploy")
    venv = tmp_path / "venv"
    stand_in_venv_with(venv, "pkg/__init__.py", "pkg/a,b.py", 'pkg/say "hi".py')
    record = next(venv.glob("lib/python3*/site-packages/pkg-1.0.dist-info/RECORD"))
    with record.open("w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        for name in ("pkg/__init__.py", "pkg/a,b.py", 'pkg/say "hi".py', "../../../../../../../../gone/from/the/host",
                     str(tmp_path / "gone-too"), "pkg-1.0.dist-info/RECORD"):
            writer.writerow((name, "sha256=x", "0"))
    assert deploy.venv_damage(venv) is None
    (next(venv.glob("lib/python3*/site-packages")) / "pkg" / "a,b.py").unlink()  # a file of its own still counts
    assert deploy.venv_damage(venv) is not None and deploy.venv_damage(venv).endswith("pkg/a,b.py")


def test_new_version_replaces_deploy_files_and_keeps_memory(venv: VenvCache, tmp_path: Path) -> None:
    from sprite_os.memory.memory_store import MemoryDB, NewLearning
    from sprite_os.memory.transcript_store import NewObservation, TranscriptDB
    ws = tmp_path / "ws"
    deploy_ok(ws, venv, "--from-checkout", str(REPO))
    memory = ws / ".os" / "memory"
    custom = {name: f"# {name}\n\nCurated content for {name}: Zoë prefers DD/MM/YYYY ✓\n" for name in CURATED}
    for name, text in custom.items():
        (memory / name).write_text(text, encoding="utf-8")
    (memory / "soul.md").write_text("someone edited the deploy-managed file\n")
    transcript, mem = TranscriptDB(memory / "transcript.db"), MemoryDB(memory / "memory.db")
    transcript.append(NewObservation(1.0, "s1", 0, "hello", "[]", "hi there"))
    mem.commit_batch(trigger="test", observation_ids=[1], model="m", input_tokens=1, output_tokens=1, cost_usd=0.0,
                     learnings=[NewLearning("FACT", "The user keeps invoices in documents/2026")],
                     file_updates={}, base_hashes={})
    transcript.close()
    mem.close()

    new = make_checkout(tmp_path, "9.1.0", template_note="Release 9.1.0 note.")
    out = deploy_ok(ws, venv, "--from-checkout", str(new))
    assert f"deploy: venv={lock_hash()} reused" in out
    assert current(ws) == "releases/9.1.0" and os.readlink(ws / ".os" / "previous") == f"releases/{VERSION}"
    assert (ws / ".os" / "VERSION").read_text().strip() == "9.1.0"
    for name in ("soul.md", "os.md"):
        text = (memory / name).read_text()
        assert text == (new / "bootstrap" / "templates" / name).read_text() and "Release 9.1.0 note." in text
    for name, text in custom.items():
        assert (memory / name).read_bytes() == text.encode("utf-8")
    # The person's edit to soul.md was replaced, but kept: it is a version in history.
    history = sorted((memory / ".history" / "soul.md").glob("*.md"))
    assert [h.read_text() for h in history][-2:] == ["someone edited the deploy-managed file\n",
                                                     (memory / "soul.md").read_text()]
    assert history[-1].name.endswith("_deploy-9-1-0.md")
    transcript, mem = TranscriptDB(memory / "transcript.db"), MemoryDB(memory / "memory.db")
    assert transcript.counts()["total"] == 1
    assert [lr.content for lr in mem.all_learnings()] == ["The user keeps invoices in documents/2026"]
    transcript.close()
    mem.close()
    assert sprite_os(ws, "version").stdout.strip() == "9.1.0"

    # A third version: garbage collection keeps only the current and the previous release.
    newer = make_checkout(tmp_path, "9.2.0", lock_comment="9.2.0")
    clone_cached_venv(venv.cache, newer / "bootstrap" / "requirements.lock")
    out = deploy_ok(ws, venv, "--from-checkout", str(newer))
    assert "deploy: venv=" in out and " linked" in out
    assert f"deploy: removed releases={VERSION} venvs=none" in out
    assert sorted(p.name for p in (ws / ".os" / "releases").iterdir()) == ["9.1.0", "9.2.0"]
    assert len(list((ws / ".os" / "venvs").iterdir())) == 2

    # Rollback switches back to the previous release (and forward again).
    done = run_deploy(ws, "--rollback")
    assert done.returncode == 0, done.stderr
    assert current(ws) == "releases/9.1.0" and sprite_os(ws, "version").stdout.strip() == "9.1.0"
    assert os.readlink(ws / ".os" / "previous") == "releases/9.2.0"
    assert "templates: written=" in done.stdout
    for name in ("soul.md", "os.md"):  # 9.2.0's files are replaced by 9.1.0's again
        assert (memory / name).read_text() == (new / "bootstrap" / "templates" / name).read_text()
    # --force re-stages the live release in place; current keeps pointing at a complete release.
    (ws / ".os" / "releases" / "9.1.0" / "src" / "commands/service.py").write_text("# damaged\n")
    out = deploy_ok(ws, venv, "--from-checkout", str(new), "--force")
    assert current(ws) == "releases/9.1.0"
    assert (ws / ".os" / "src" / "commands/service.py").read_bytes() == (REPO / "os_src" / "commands/service.py").read_bytes()
    assert not list((ws / ".os" / "releases").glob("*.partial-*"))


# ---------------------------------------------------------------- killed deploys


def test_a_removal_cut_short_leaves_nothing_a_later_deploy_would_reuse(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A deploy killed while its gc removes an old release (or venv) left it half-removed under its
    name, `.complete` and all: a later deploy of that version took it as staged (a venv as built),
    and ran, or switched to, what was left of it. The folder leaves its name before it is emptied."""
    deploy = load_script("deploy")
    p = deploy.Paths(tmp_path / "ws")
    p.use(deploy.load_contract(REPO / "os_src"))
    old = p.releases / "0.9.0"
    (old / "src").mkdir(parents=True)
    (old / "src" / "server.py").write_text("")
    (old / ".complete").write_text("0.9.0\n")
    p.venvs.mkdir()

    def killed(path: Path, *_: Any, **__: Any) -> None:  # some files gone, then the kill
        (Path(path) / "src" / "server.py").unlink()
        raise KeyboardInterrupt

    monkeypatch.setattr(deploy.shutil, "rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        deploy.collect_garbage(p)
    monkeypatch.undo()
    assert not old.exists() and not deploy.is_complete_release(old)  # staged afresh by the next deploy
    [left] = p.releases.iterdir()
    assert left.name.startswith("0.9.0.removing-")
    assert deploy.collect_garbage(p)[0] == [left.name] and list(p.releases.iterdir()) == []


def test_what_a_removal_cut_short_left_goes_at_a_noop_deploy_and_a_rollback(tmp_path: Path) -> None:
    """A gc cut short (a kill, a power loss) leaves `<name>.removing-*` folders, a venv's hundreds of MB;
    only a deploy's gc removed them, so a Sprite redeployed at the same version, or rolled back, kept them
    until its next real deploy. Both remove them now. No pip: the venvs are stand-ins."""
    deploy = load_script("deploy")
    ws = tmp_path / "ws"
    p = deploy.Paths(ws)
    for version, venv in (("2.0.0", "now"), ("1.0.0", "before")):
        release = p.releases / version
        release.mkdir(parents=True)
        deploy.Checkout(REPO).stage(release)  # the MANIFEST a --from-checkout deploy of REPO compares
        stand_in_venv(p.venvs / venv, sys.executable)
        os.symlink(f"../../venvs/{venv}", release / "venv")
        (release / ".complete").write_text(f"{version}\n")
    (p.releases / "2.0.0" / "VERSION").write_text(f"{VERSION}\n")
    os.rename(p.releases / "2.0.0", p.releases / VERSION)
    os.symlink(f"releases/{VERSION}", p.current)
    os.symlink("releases/1.0.0", p.previous)
    os.symlink("current/VERSION", p.version)

    def cut_short() -> list[Path]:
        left = [p.releases / "0.9.0.removing-1a2b3c4d", p.venvs / "0123456789abcdef.removing-5e6f7a8b"]
        for folder in left:
            (folder / "lib").mkdir(parents=True)
            (folder / "lib" / "half-removed.py").write_text("")
        return left

    left = cut_short()
    done = run_deploy(ws, "--from-checkout", str(REPO))
    assert done.returncode == 0 and done.stdout.startswith(f"deploy: already at {VERSION}\n"), done.stdout + done.stderr
    assert not any(folder.exists() for folder in left), done.stdout
    left = cut_short()
    done = run_deploy(ws, "--rollback")
    assert done.returncode == 0 and os.readlink(p.current) == "releases/1.0.0", done.stdout + done.stderr
    assert not any(folder.exists() for folder in left), done.stdout
    assert sorted(e.name for e in p.releases.iterdir()) == sorted(["1.0.0", VERSION])
    # The removal is a tidy-up: one it cannot make (the deploy lock cannot be opened, as on a read-only
    # .os, a folder it cannot read) does not fail the no-op deploy it follows, which said `already at V`.
    done = run_deploy(ws, "--rollback")
    assert done.returncode == 0 and os.readlink(p.current) == f"releases/{VERSION}", done.stdout + done.stderr
    left = cut_short()
    lock = ws / ".os" / "state" / "deploy.lock"
    lock.unlink()
    lock.mkdir()  # os.open(O_RDWR) fails on it, as on a read-only file system
    try:
        done = run_deploy(ws, "--from-checkout", str(REPO))
        assert (done.returncode, done.stdout, done.stderr) == (0, f"deploy: already at {VERSION}\n", "")
    finally:
        lock.rmdir()


def test_the_removal_of_what_a_removal_cut_short_left_says_only_what_is_gone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The removal ignored its errors and said "removed" whatever was left; a look it could not make at all
    (another deploy holding the lock) was dropped without a word. It says what it removed and what it could
    not, and logs a look it skipped."""
    deploy = load_script("deploy")
    p = deploy.Paths(tmp_path / "ws")
    p.use(deploy.load_contract(REPO / "os_src"))
    stuck, gone = p.venvs / "0123.removing-1a2b3c4d", p.venvs / "4567.removing-5e6f7a8b"
    for folder in (stuck, gone):
        (folder / "lib").mkdir(parents=True)
    log = tmp_path / "deploy.log"
    monkeypatch.setattr(deploy.out, "_log", log)
    rmtree = shutil.rmtree

    def refused(path: Path, *args: Any, **kwargs: Any) -> None:
        if Path(path) == stuck:
            raise PermissionError(13, "Permission denied", str(path / "lib"))
        rmtree(path, *args, **kwargs)

    monkeypatch.setattr(deploy.shutil, "rmtree", refused)
    deploy.remove_leftovers(p)
    said = capsys.readouterr().out
    assert said == (f"deploy: could not remove venvs/{stuck.name} (a removal cut short): [Errno 13] Permission "
                    f"denied: '{stuck / 'lib'}'\n"
                    f"deploy: removed venvs/{gone.name} (a removal cut short)\n"), said
    assert stuck.exists() and not gone.exists()

    def held(_p: Any) -> None:  # another deploy holds the lock: its own gc removes them
        raise deploy.DeployError("another deploy is running")

    monkeypatch.setattr(deploy, "deploy_lock", held)
    deploy.remove_leftovers(p)
    assert capsys.readouterr().out == "" and stuck.exists()
    assert log.read_text().rstrip().endswith(
        "deploy: what a removal cut short left is not looked for: another deploy is running"), log.read_text()


def test_a_release_whose_version_looks_like_a_removal_cut_short_is_not_removed(tmp_path: Path) -> None:
    """A version may hold `.removing-` (`1.0.removing-1a2b3c4d` matched the version rule): the removal of what a
    gc cut short, at a rollback, removed the release it had just switched to (and, at a no-op deploy, the
    current one), by its name alone. Kept releases are never removed now, and a new version naming one of
    the deploy's own marks (`.removing-`, `.partial-`) is refused. No pip: the venvs are stand-ins."""
    deploy = load_script("deploy")
    ws = tmp_path / "ws"
    p = deploy.Paths(ws)
    odd = "1.0.removing-1a2b3c4d"
    for version in ("2.0.0", odd):
        release = p.releases / version
        release.mkdir(parents=True)
        deploy.Checkout(REPO).stage(release)
        (release / "VERSION").write_text(f"{version}\n")
        stand_in_venv(p.venvs / version.replace(".", ""), sys.executable)
        os.symlink(f"../../venvs/{version.replace('.', '')}", release / "venv")
        (release / ".complete").write_text(f"{version}\n")
    os.symlink("releases/2.0.0", p.current)
    os.symlink(f"releases/{odd}", p.previous)
    os.symlink("current/VERSION", p.version)
    done = run_deploy(ws, "--rollback")
    assert done.returncode == 0 and os.readlink(p.current) == f"releases/{odd}", done.stdout + done.stderr
    assert (p.releases / odd / ".complete").is_file(), done.stdout
    assert "removed" not in done.stdout, done.stdout
    for version in (odd, "2.0.partial-1a2b3c4d"):
        with pytest.raises(deploy.DeployError, match="bad version"):
            deploy.check_version(version, "VERSION")
    assert deploy.check_version("2.0.0-rc.1+build.7", "VERSION") == "2.0.0-rc.1+build.7"


@pytest.mark.parametrize("cached", [True, False])
def test_a_venv_that_fails_half_made_is_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cached: bool) -> None:
    """A deploy that ran out of disk copying the cached venv (or whose pip install failed) left the
    half-made venv behind: a full disk for the version still serving, until the next deploy."""
    deploy = load_script("deploy")
    p, contract, release = release_on_the_lock(deploy, tmp_path)
    cache = tmp_path / "cache"
    if cached:
        (cache / lock_hash() / "bin").mkdir(parents=True)
        (cache / lock_hash() / ".complete").write_text("built\n")
        os.symlink(sys.executable, cache / lock_hash() / "bin" / "python")
        (cache / lock_hash() / "pyvenv.cfg").write_text(f"version = {deploy.deploying_python()}.0\n")

    def no_room(cmd: list[str], what: str, **_: Any) -> None:  # cp -a, or python -m venv + pip: half made
        target = Path(cmd[-1])  # what the command makes
        (target / "lib").mkdir(parents=True, exist_ok=True)
        (target / "lib" / "half-written").write_bytes(b"x" * 1000)
        raise deploy.DeployError(f"{what} failed (exit 1): No space left on device")

    monkeypatch.setattr(deploy, "run", no_room)
    with pytest.raises(deploy.DeployError, match="No space left on device"):
        deploy.ensure_venv(p, release, contract, None, cache if cached else None)
    assert list(p.venvs.iterdir()) == []


def test_killed_deploy_leaves_the_previous_version_serving(venv: VenvCache, tmp_path: Path,
                                                           service_env: dict[str, str]) -> None:
    ws = tmp_path / "ws"
    port = int(service_env["SPRITE_OS_PORT"])
    deploy_ok(ws, venv, "--from-checkout", str(REPO), "--token-file", str(token_file(tmp_path)))
    started = sprite_os(ws, "service", "start", env=service_env)
    assert started.returncode == 0, started.stdout + started.stderr
    new = make_checkout(tmp_path, "9.3.0", lock_comment="9.3.0 (a new venv)", template_note="9.3.0")
    clone_cached_venv(venv.cache, new / "bootstrap" / "requirements.lock")
    # The killed deploys hold once the new code has written the templates, the last thing before the
    # switch: the kill lands before the switch however late a loaded machine runs the killer (the
    # templates' step and the switch take under 0.3 s: a kill that late found the new version current).
    main = new / "os_src" / "commands" / "main.py"
    said = "    print(f\"templates: written={','.join(written) or 'none'}\")\n"
    assert said in main.read_text()
    main.write_text(main.read_text().replace(said, said.replace(")\n", ", flush=True)\n") + (
        "    if __import__('os').environ.get('DEPLOY_TEST_HOLD_AFTER_TEMPLATES'):\n"
        "        __import__('time').sleep(600)\n")))
    held = {**service_env, "DEPLOY_TEST_HOLD_AFTER_TEMPLATES": "1"}
    cmd = deploy_cmd(ws, "--from-checkout", str(new), "--venv-cache", str(venv.cache), "--venv-cache-links")
    try:
        # Killed as each step starts, and inside two: while migrate-v1 runs, and once the templates
        # are written (the last thing before the switch).
        markers = ("deploy: step=stage ", "deploy: step=venv ", "deploy: step=migrate ", "migrate: schema ",
                   "deploy: step=templates ", "templates: written=")
        for marker in markers:
            # At the venv step, copy the cached venv (seconds) rather than link it, to kill it mid-way.
            killed, out = run_until(cmd[:-1] if "venv" in marker else cmd, marker, env=held)
            assert killed, out
            assert current(ws) == f"releases/{VERSION}", marker
            assert (ws / ".os" / "VERSION").read_text().strip() == VERSION
            assert (healthz(port, ws) or {}).get("version") == VERSION  # still serving
            if marker != markers[-1]:  # (after this one, the rollback below restarts it)
                restarted = sprite_os(ws, "service", "restart", env=service_env)  # and still starts
                assert restarted.returncode == 0, f"after a kill at {marker}: {restarted.stdout}{restarted.stderr}"
                assert (healthz(port, ws) or {}).get("version") == VERSION
        # A release that does not start is rolled back: the previous version starts and serves again.
        pid = int((ws / ".os" / "state" / "server.pid").read_text())
        broken = make_checkout(tmp_path, "9.3.1", template_note="9.3.1 never started")
        (broken / "os_src" / "commands/service.py").write_text(
            "def service_main(settings, action):\n    print('sprite-os: error: broken on purpose')\n    return 1\n")
        done = subprocess.run(deploy_cmd(ws, "--from-checkout", str(broken), "--venv-cache", str(venv.cache)),
                              capture_output=True, text=True, env=service_env, timeout=300)
        assert done.returncode == 1 and f"rolled back to {VERSION}" in done.stderr, done.stdout + done.stderr
        assert "sprite-os: error: broken on purpose" in done.stdout
        assert current(ws) == f"releases/{VERSION}"
        for name in ("soul.md", "os.md"):  # the release rolled back to has its own files again
            assert (ws / ".os" / "memory" / name).read_bytes() == (TEMPLATES / name).read_bytes()
        assert int((ws / ".os" / "state" / "server.pid").read_text()) != pid  # restarted
        assert (healthz(port, ws) or {}).get("version") == VERSION
        # The next deploy completes: it cleans up what the killed ones left and restarts the server.
        done = subprocess.run(cmd, capture_output=True, text=True, env=service_env, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "deploy: step=restart version=9.3.0 pid=" in done.stdout
        assert current(ws) == "releases/9.3.0"
        assert (healthz(port, ws) or {}).get("version") == "9.3.0"
        assert sorted(p.name for p in (ws / ".os" / "releases").iterdir()) == sorted([VERSION, "9.3.0"])
        assert not list((ws / ".os" / "venvs").glob("*.partial-*"))
    finally:
        stop_and_check(ws, service_env)


def test_killed_after_the_switch_the_new_version_is_complete(venv: VenvCache, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    deploy_ok(ws, venv, "--from-checkout", str(REPO))
    new = make_checkout(tmp_path, "9.4.0")
    killed, out = run_until(deploy_cmd(ws, "--from-checkout", str(new), "--venv-cache", str(venv.cache)),
                            "deploy: step=links ", env=base_env())
    assert killed, out
    assert current(ws) == "releases/9.4.0"
    assert (ws / ".os" / "current" / ".complete").is_file() and (ws / ".os" / "current" / "venv" / ".complete").is_file()
    assert sprite_os(ws, "version").stdout.strip() == "9.4.0"
    done = run_deploy(ws, "--from-checkout", str(new))
    assert done.stdout == "deploy: already at 9.4.0\n", done.stdout + done.stderr


# ---------------------------------------------------------------- v1 workspaces


def test_deploy_migrates_a_v1_workspace(venv: VenvCache, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    # A deploy killed inside the migration, its first chunk of turns committed: the next one resumes
    # it, after whichever chunk the kill found committed. Twenty chunks of turns are left when the line is
    # read (over a second of work here): with six (0.4 s), a kill that a loaded machine delivered late
    # found the migration already done, and the next deploy had nothing to resume.
    data = make_v1_workspace(ws, observations=20 * ROWS_PER_COMMIT, learnings=300, actions=40)
    cache = ("--venv-cache", str(venv.cache), "--venv-cache-links")
    killed, out = run_until(deploy_cmd(ws, "--from-checkout", str(REPO), *cache),
                            f"migrate: table=observations copied={ROWS_PER_COMMIT}/", env=base_env())
    assert killed, out
    assert not (ws / ".os" / "current").exists() and (ws / "agent.db").exists()
    out = deploy_ok(ws, venv, "--from-checkout", str(REPO))
    resumed = re.search(r"migrate: table=observations resuming after id=(\d+) ", out)
    assert resumed is not None, out
    assert int(resumed[1]) % ROWS_PER_COMMIT == 0 and 0 < int(resumed[1]) < data.counts["observations"]
    assert f"migrate: verified table=observations rows={data.counts['observations']} " in out
    assert out.index("migrate: done") < out.index("deploy: step=templates")
    assert not (ws / "agent.db").exists() and not (ws / "memory").exists()
    memory = ws / ".os" / "memory"
    assert (memory / "tools.md").read_text(encoding="utf-8") == V1_FILES["tools.md"]
    assert (memory / "user.md").read_text(encoding="utf-8") == V1_FILES["user.md"]
    assert (memory / "os.md").read_bytes() == (TEMPLATES / "os.md").read_bytes()
    assert (memory / "context.md").read_bytes() == (TEMPLATES / "context.md").read_bytes()
    backups = list((ws / ".os" / "backup").glob("v1-*"))
    assert len(backups) == 1 and (backups[0] / "agent.db").is_file()
    assert (backups[0] / "memory" / "os.md").read_text() == V1_FILES["os.md"]


def test_deploy_onto_malformed_v1_fails_and_keeps_everything(venv: VenvCache, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    make_v1_workspace(ws, observations=200, learnings=20, actions=5, wal=False)
    (ws / "agent.db").write_bytes((ws / "agent.db").read_bytes()[:4096])  # truncated: corrupt
    before = hashlib.sha256((ws / "agent.db").read_bytes()).hexdigest()
    done = run_deploy(ws, "--from-checkout", str(REPO), "--venv-cache", str(venv.cache), "--venv-cache-links")
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("deploy: error: migrate-v1 failed (exit 1): "
                                                                   "migrate: error: "), done.stderr
    assert not (ws / ".os" / "current").exists()  # nothing was switched
    assert hashlib.sha256((ws / "agent.db").read_bytes()).hexdigest() == before
    assert (ws / "memory" / "user.md").read_text(encoding="utf-8") == V1_FILES["user.md"]


# ---------------------------------------------------------------- bad input


def test_bad_input_gets_one_clear_line(venv: VenvCache, tmp_path: Path) -> None:
    ws = tmp_path / "ws"

    def fails(*args: str) -> str:
        done = run_deploy(ws, *args)
        assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stdout + done.stderr
        assert done.stderr.startswith("deploy: error: ")
        return done.stderr

    assert "nothing is deployed" in fails("--rollback")
    assert "cannot read release" in fails("--release", str(tmp_path / "missing.tar.gz"))
    (tmp_path / "garbage.tar.gz").write_bytes(b"not a tarball")
    assert "cannot read release" in fails("--release", str(tmp_path / "garbage.tar.gz"))
    evil = make_checkout(tmp_path, "evil")
    (evil / "VERSION").write_text("../../evil\n")  # would name a path outside releases/
    assert "bad version" in fails("--from-checkout", str(evil))
    unsafe = tmp_path / "unsafe.tar.gz"
    with tarfile.open(unsafe, "w:gz") as tf:
        for name, data in (("VERSION", b"9.9.9\n"), ("../outside.txt", b"x")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    assert "unsafe entry" in fails("--release", str(unsafe))
    assert not (tmp_path / "outside.txt").exists()
    (tmp_path / "short-token").write_text("short\n")
    assert "at least 16" in fails("--from-checkout", str(REPO), "--token-file", str(tmp_path / "short-token"))
    usage = run_deploy(ws, "--from-checkout", str(REPO), "--release", "x.tar.gz")
    assert usage.returncode == 2

    # One deploy at a time.
    (ws / ".os" / "state").mkdir(parents=True, exist_ok=True)
    fd = os.open(ws / ".os" / "state" / "deploy.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        assert "another deploy is running" in fails("--from-checkout", str(REPO))
    finally:
        os.close(fd)

    # Root must not deploy into someone else's workspace (files would end up owned by root).
    if os.geteuid() == 0:
        other = tmp_path / "other"
        other.mkdir()
        os.chown(other, 1000, 1000)
        done = run_deploy(other, "--from-checkout", str(REPO))
        assert done.returncode == 1 and "not as root" in done.stderr


def repacked(tarball: Path, target: Path, *, drop: str = "", add: str = "", damage: str = "",
             modes: dict[str, int] | None = None, owners: dict[str, int] | None = None,
             manifest_last: bool = False) -> Path:
    """`tarball` packed again: without the member `drop`, with a file `add`, with `damage`'s last byte
    changed, with the `modes` and owners (uid and gid) given, with MANIFEST packed last (as a `tar` of
    the unpacked release may order it)."""
    with tarfile.open(tarball) as tin, tarfile.open(target, "w:gz") as tout:
        members = tin.getmembers()
        if manifest_last:
            members.sort(key=lambda member: member.name == MANIFEST_NAME)
        for member in members:
            data = tin.extractfile(member).read() if member.isfile() else None  # type: ignore[union-attr]
            if member.name == drop:
                continue
            member.mode = (modes or {}).get(member.name, member.mode)
            member.uid = member.gid = (owners or {}).get(member.name, member.uid)
            if member.name == damage and data:
                data = data[:-1] + bytes([data[-1] ^ 1])
            tout.addfile(member, io.BytesIO(data) if data is not None else None)
        if add:
            tout.addfile(tarfile.TarInfo(add), io.BytesIO(b""))
    return target


def test_a_release_that_does_not_match_its_manifest_is_refused_at_staging(tmp_path: Path) -> None:
    """A tarball cut short and packed again, or with a file lost, damaged or added, is refused while
    it is staged: it would have been switched to, and with no server running to restart, said done
    (exit 0) while `service start` failed on a missing module. No pip: each is refused before its venv."""
    tarball = load_script("build_release").build(REPO, tmp_path / "dist")
    with tarfile.open(tarball) as tf:
        files = [member.name for member in tf.getmembers() if member.isfile()]
        listing = tf.extractfile("MANIFEST").read().decode()  # type: ignore[union-attr]
    assert files[:2] == ["VERSION", "MANIFEST"]  # VERSION first as ever; the listing right after it
    assert [line.split("  ", 1)[1] for line in listing.splitlines()] == files[:1] + files[2:]
    nowhere = tmp_path / "no-wheels"  # the old code went on to build a venv: it fails fast here
    nowhere.mkdir()
    cases = {"lost": (repacked(tarball, tmp_path / "lost.tar.gz", drop="src/server.py"), "missing src/server.py"),
             "damaged": (repacked(tarball, tmp_path / "damaged.tar.gz", damage="src/config.py"),
                         "damaged src/config.py"),
             "added": (repacked(tarball, tmp_path / "added.tar.gz", add="src/stray.py"), "not listed src/stray.py"),
             "unlisted": (repacked(tarball, tmp_path / "unlisted.tar.gz", drop="MANIFEST"), "no readable MANIFEST")}
    for case, (bad, said) in cases.items():
        ws = tmp_path / f"ws-{case}"
        done = run_deploy(ws, "--release", str(bad), "--wheelhouse", str(nowhere), "--venv-cache", str(nowhere))
        assert done.returncode == 1 and done.stderr.count("\n") == 1, (case, done.stdout + done.stderr)
        assert said in done.stderr and "step=venv" not in done.stdout, (case, done.stdout + done.stderr)
        assert not (ws / ".os" / "current").exists() and not list((ws / ".os" / "venvs").iterdir())
        assert list((ws / ".os" / "releases").iterdir()) == []  # the refused copy removed
    # What build_release packs, and what a checkout's deploy stages, match their manifests.
    deploy = load_script("deploy")
    for source in (deploy.Tarball(tarball), deploy.Checkout(REPO)):
        staged = tmp_path / f"staged-{type(source).__name__}"
        staged.mkdir()
        source.stage(staged)
        deploy.check_manifest(staged, VERSION)


def test_a_releases_own_modes_are_not_trusted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tarball whose files are world-writable, setuid or some user's: on a Python without tarfile's
    data filter (before 3.11.4) they were staged so, and a world-writable (or uid 1000's) server.py
    under .os, which the agent's user may pass through, is a way to change the code root runs."""
    tarball = load_script("build_release").build(REPO, tmp_path / "dist")
    bad = repacked(tarball, tmp_path / "modes.tar.gz",
                   modes={"src": 0o777, "src/server.py": 0o666, "src/config.py": 0o4777, "src/paths.py": 0o000},
                   owners={"src/runtime.py": 1000})
    monkeypatch.delattr(tarfile, "data_filter", raising=False)  # a Python before 3.11.4
    deploy = load_script("deploy")
    p = deploy.Paths(tmp_path / "ws")
    p.use(deploy.load_contract(REPO / "os_src"))
    p.releases.mkdir(parents=True)
    release, _ = deploy.stage_release(p, deploy.Tarball(bad), VERSION, False)
    modes = {name: oct(stat.S_IMODE((release / name).stat().st_mode))
             for name in ("src", "src/server.py", "src/config.py", "src/paths.py", "bootstrap/deploy.py")}
    assert modes == {"src": "0o755", "src/server.py": "0o644", "src/config.py": "0o755", "src/paths.py": "0o644",
                     "bootstrap/deploy.py": "0o755"}, modes
    for folder, dirs, files in os.walk(release):
        for name in dirs + files:
            path = Path(folder, name)
            if not path.is_symlink():  # no one else writes; no setuid; the deploying user's
                assert path.lstat().st_mode & 0o7022 == 0 and path.lstat().st_uid == os.geteuid(), path


def test_a_manifest_takes_any_utf8_name_and_a_name_it_cannot_hold_is_one_line(tmp_path: Path) -> None:
    """A MANIFEST is read by its newlines alone: names holding a form feed, U+0085 or U+2028 (which
    splitlines() also splits at) made a good release "malformed". A MANIFEST gone CRLF still reads. A
    file whose name is not UTF-8 could not be listed: build_release.py and a checkout's deploy ended in
    a UnicodeEncodeError traceback; each now says which file, in one line."""
    deploy = load_script("deploy")
    build = load_script("build_release")
    odd = make_checkout(tmp_path, "9.9.1")
    for name in ("form\x0cfeed.txt", "next\x85line.txt", "line\u2028sep.txt"):
        (odd / "os_src" / name).write_text("kept\n")
    staged = tmp_path / "staged"
    staged.mkdir()
    deploy.Tarball(build.build(odd, tmp_path / "dist")).stage(staged)
    deploy.check_manifest(staged, "9.9.1")  # raised "malformed MANIFEST line"
    listing = staged / MANIFEST_NAME
    listing.write_bytes(listing.read_bytes().replace(b"\n", b"\r\n"))
    deploy.check_manifest(staged, "9.9.1")

    bad = make_checkout(tmp_path, "9.9.2")
    with open(os.fsencode(bad / "os_src") + b"/caf\xe9.txt", "wb") as f:
        f.write(b"not listable\n")
    built = subprocess.run([sys.executable, str(REPO / "bootstrap" / "build_release.py"), "--checkout", str(bad),
                            "--out", str(tmp_path / "dist2")], capture_output=True, text=True, timeout=60)
    done = run_deploy(tmp_path / "ws", "--from-checkout", str(bad))
    for what in (built, done):
        assert what.returncode == 1 and what.stderr.count("\n") == 1, what.stderr
        assert "caf\\xe9.txt' has a name that is not UTF-8" in what.stderr, what.stderr
    # Such a name in a tarball (packed elsewhere) is not listed: refused in one line, and in the deploy's
    # log, where writing it ended the deploy in a UnicodeEncodeError traceback.
    stray = tarfile.TarInfo(os.fsdecode(b"src/caf\xe9.py"))
    stray.size = 1
    odd_tarball = tmp_path / "odd-name.tar.gz"
    with tarfile.open(tmp_path / "dist" / "sprite-os-9.9.1.tar.gz") as tin, \
            tarfile.open(odd_tarball, "w:gz", format=tarfile.GNU_FORMAT) as tout:
        for member in tin.getmembers():
            tout.addfile(member, tin.extractfile(member) if member.isfile() else None)
        tout.addfile(stray, io.BytesIO(b"x"))
    ws = tmp_path / "ws-odd"
    done = run_deploy(ws, "--release", str(odd_tarball), "--wheelhouse", str(tmp_path), "--venv-cache", str(tmp_path))
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert "does not match its MANIFEST: not listed src/caf\\udce9.py" in done.stderr, done.stderr
    assert "not listed src/caf\\udce9.py" in (ws / ".os" / "logs" / "deploy.log").read_text()
    assert [path.name for path in (ws / ".os" / "releases").iterdir()] == []


def test_root_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    """As root, on a workspace (or, before it exists, a parent) someone else owns: refused in
    main, before the token, the no-op path or a rollback could write a root-owned file."""
    deploy = load_script("deploy")
    ws = tmp_path / "ws"
    ws.mkdir()
    if os.geteuid() == 0:
        os.chown(ws, 1000, 1000)
    owner = ws.stat().st_uid
    for where in (ws, ws / "not-yet"):  # an existing workspace, and one whose parent is the user's
        p = deploy.Paths(where)
        with pytest.raises(deploy.DeployError, match=rf"owner of {ws} \(uid {owner}\), not as root"):
            deploy.check_owner(p, 0)
        deploy.check_owner(p, owner)  # the owner itself may
    token = token_file(tmp_path)
    with pytest.MonkeyPatch.context() as mp:  # through main, as (or posing as) root: nothing is written
        mp.setattr(deploy.os, "geteuid", lambda: 0)
        assert deploy.main(["--workspace", str(ws), "--from-checkout", str(REPO), "--token-file", str(token)]) == 1
        assert deploy.main(["--workspace", str(ws), "--rollback"]) == 1
    assert list(ws.iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="the agent's user is made by a deploy as root")
@pytest.mark.parametrize("user", ["nobody", "root", "daemon"])
def test_a_service_or_a_persons_user_is_refused_before_anything_switches(tmp_path: Path, user: str) -> None:
    """Named the agent's user, a service's user would lend the agent its files and groups, and each
    start would kill its processes: refused right after staging, with the previous state serving."""
    ws = tmp_path / "ws"
    done = run_deploy(ws, "--from-checkout", str(REPO), env=base_env(SPRITE_AGENT_USER=user))
    assert done.returncode == 1
    assert f"the user {user!r} exists and was not made for the agent" in done.stderr, done.stderr
    assert not (ws / ".os" / "current").exists() and not list((ws / ".os" / "venvs").iterdir())  # no switch, no venv


def test_a_restart_never_passes_a_stale_token_from_the_deploying_shell(tmp_path: Path) -> None:
    """The service writes SPRITE_OS_TOKEN into .os/token; passed by a deploy's restart, a stale
    export would overwrite the token --token-file just installed."""
    deploy = load_script("deploy")
    seen: list[dict[str, str]] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPRITE_OS_TOKEN", "stale-token-from-the-shell-0123")
        mp.setenv("SPRITE_MEMORY_MODEL", "kept-as-it-is")
        mp.setattr(deploy, "run", lambda cmd, what, env=None, **_: seen.append(env or {}))
        deploy.restart_service(deploy.Paths(tmp_path))
    [env] = seen
    assert "SPRITE_OS_TOKEN" not in env and env["SPRITE_MEMORY_MODEL"] == "kept-as-it-is"


def test_the_check_and_migrate_get_no_secret_of_the_deploying_shell(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The import check, migrate-v1 and install-templates need no credentials, yet got the deploying
    shell's ANTHROPIC_API_KEY and any other secret exported there (a cloud key, a registry token), in a
    process that runs the new release's code before anything vouches for it. They get none now; the
    settings they read stay, and so does what the restart needs. The venv's python is a stand-in that
    writes down the environment it was given."""
    deploy = load_script("deploy")
    p = deploy.Paths(tmp_path / "ws")
    p.os.mkdir(parents=True)
    seen = tmp_path / "seen"
    python = p.venvs / "h" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f"#!/bin/sh\nenv -0 >> {seen}\nprintf '\\001' >> {seen}\n")
    python.chmod(0o755)
    secrets = {"ANTHROPIC_API_KEY": "sk-ant-of-the-shell", "ANTHROPIC_AUTH_TOKEN": "bearer-of-the-shell",
               "SPRITE_OS_TOKEN": "token-of-the-shell-0123456", "AWS_SECRET_ACCESS_KEY": "aws-of-the-shell",
               "GITHUB_TOKEN": "ghp-of-the-shell", "DATABASE_PASSWORD": "hunter2"}
    for name, value in {**secrets, "SPRITE_AGENT_MAX_TOKENS": "16000", "ANTHROPIC_BASE_URL": "http://proxy"}.items():
        monkeypatch.setenv(name, value)
    release = p.releases / "1.0.0"
    deploy.check_start(p, release, "h", "1.0.0")
    deploy.run_migrate(p, release, "h")
    deploy.write_templates(p, release, "h", "1.0.0")
    envs = [dict(entry.split("=", 1) for entry in block.split("\0") if "=" in entry)
            for block in seen.read_text().split("\x01") if block]
    assert len(envs) == 3
    # Only names and the test's own values are compared (and so printed on a failure): the shell's environment
    # the test runs in is not the test's to print.
    seen_env = [(sorted(set(secrets) & set(env)), env.get("SPRITE_AGENT_MAX_TOKENS"), env.get("ANTHROPIC_BASE_URL"),
                 env.get("PYTHONPATH")) for env in envs]
    del envs
    assert seen_env == [([], "16000", "http://proxy", str(release / "lib"))] * 3
    restarted: list[dict[str, str]] = []
    monkeypatch.setattr(deploy, "run", lambda cmd, what, env=None, **_: restarted.append(env or {}))
    deploy.restart_service(p)
    key = restarted[0].get("ANTHROPIC_API_KEY")
    assert key == "sk-ant-of-the-shell"  # the server's, remembered by the service


def test_credentials_named_without_a_separate_word_or_held_in_a_url_are_left_out_too(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The filter took a credential by a whole word of its name: PostgreSQL's PGPASSWORD (one word), MySQL's
    MYSQL_PWD, an SMTP_PASS, the ssh agent's socket (SSH_AUTH_SOCK: what it reaches signs as the operator),
    a lowercase npm_config__auth, and a password inside a URL (DATABASE_URL, HTTPS_PROXY) all went to the
    new release's code. What the commands read stays: settings that count tokens, the proxy's base URL."""
    deploy = load_script("deploy")
    secrets = {"PGPASSWORD": "hunter2", "MYSQL_PWD": "hunter2", "SMTP_PASS": "hunter2", "GHTOKEN": "ghp-1",
               "SSH_AUTH_SOCK": "/tmp/ssh-agent.sock", "npm_config__auth": "dXNlcjpwYXNz",
               "DATABASE_URL": "postgres://app:hunter2@db:5432/app", "HTTPS_PROXY": "http://me:hunter2@proxy:3128"}
    kept = {"SPRITE_AGENT_MAX_TOKENS": "16000", "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "8000",
            "ANTHROPIC_BASE_URL": "http://127.0.0.1:8080", "TOKENIZERS_PARALLELISM": "false",
            "HTTP_PROXY": "http://proxy:3128", "SPRITE_OS_PORT": "8765", "SPRITE_WORKSPACE": "/ws"}
    for name, value in {**secrets, **kept}.items():
        monkeypatch.setenv(name, value)
    env = deploy.deploying_env(keep_credentials=False)
    leaked, lost = sorted(set(secrets) & set(env)), {name: env.get(name) for name in kept}
    del env  # the shell's own variables are not the test's to print
    assert leaked == []
    assert lost == kept


def test_the_host_tools_a_deploy_reads_the_output_of_speak_english(monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk is found by the English words of the error (DISK_FULL): on a localized host, cp said
    it in the host's language, and the deploy's line was cp's last, not the full disk. The host's tools
    (cp, venv, pip) run with LC_ALL=C; the restart's server keeps the host's locale."""
    deploy = load_script("deploy")
    monkeypatch.setenv("LC_ALL", "de_DE.UTF-8")
    monkeypatch.setenv("LANG", "de_DE.UTF-8")
    with pytest.raises(deploy.DeployError) as failed:
        deploy.run(["sh", "-c", 'echo "$LC_ALL $LANG"; exit 3'], "copying the cached venv")
    assert str(failed.value) == "copying the cached venv failed (exit 3): C de_DE.UTF-8"
    with pytest.raises(deploy.DeployError) as failed:
        deploy.run(["sh", "-c", 'echo "$LC_ALL"; exit 3'], "service restart", env=deploy.deploying_env(
            keep_credentials=True))
    assert str(failed.value) == "service restart failed (exit 3): de_DE.UTF-8"


def test_a_failed_command_is_said_by_its_error_line_not_the_log_lines_after_it(tmp_path: Path) -> None:
    """A restart that fails prints its error, then the tail of the server's logs: the deploy's one
    line said the last of those (the old server's `server_stopped`), not why the new one did not start."""
    deploy = load_script("deploy")
    new_reason = "sprite-os: error: the server did not start: ModuleNotFoundError: No module named x"
    timed_out = "sprite-os: error: the server did not start: /healthz did not answer within 30s; stopped it"
    # The second: the tail of server.out is not only this start's, and an older server's error there is
    # not the reason (it was said, being the last error line).
    for printed, said in (
            (["sprite-os: stopped (pid 1, 0.1s)", new_reason, "--- last lines of sprite-os.log:",
              '{"event": "server_stopped"}'], new_reason),
            ([timed_out, "--- last lines of server.out:",
              "sprite-os: error: cannot listen on 0.0.0.0:8765: address already in use"], timed_out),
            # An older server's full disk in the tail (a week ago, the disk since freed) is not this start's reason
            # either: the full-disk line won over every error line, wherever it came.
            ([new_reason, "--- last lines of server.out:", "Traceback (most recent call last):",
              "OSError: [Errno 28] No space left on device"], new_reason)):
        script = "".join(f"print({line!r}); " for line in printed) + "raise SystemExit(1)"
        with pytest.raises(deploy.DeployError) as failed:
            deploy.run([sys.executable, "-c", script], "service restart")
        assert str(failed.value) == f"service restart failed (exit 1): {said}"
    with pytest.raises(deploy.DeployError) as failed:  # no error line: the last line, as before
        deploy.run([sys.executable, "-c", "print('one'); print('two'); raise SystemExit(3)"], "creating the venv")
    assert str(failed.value) == "creating the venv failed (exit 3): two"


def test_a_command_on_a_full_disk_is_one_line_and_a_small_log(tmp_path: Path) -> None:
    """A venv copy onto a full disk printed a `cp` error for each of its thousands of files: deploy.log grew
    to 1.2 MB of them in one deploy (it is rotated only between deploys), and the deploy's line was the
    last of them. A command's output is now logged up to its first and last lines, with the count of those
    between; the full disk is said once, by the first error that says it (the cause, not its echoes)."""
    deploy = load_script("deploy")
    log = tmp_path / "logs" / "deploy.log"
    deploy.out.open_log(log)
    script = ("import sys\n"
              "print('copying the venv')\n"
              "for n in range(40000):\n"
              "    print(f\"cp: error writing '/ws/.os/venvs/h.partial-1/lib/f{n}.py': No space left on device\")\n"
              "print('cp: preserving times for /ws/.os/venvs/h.partial-1: No space left on device')\n"
              "sys.exit(1)\n")
    with pytest.raises(deploy.DeployError) as failed:
        deploy.run([sys.executable, "-c", script], "copying the cached venv")
    assert str(failed.value) == ("copying the cached venv failed (exit 1): no space left on device: "
                                 "cp: error writing '/ws/.os/venvs/h.partial-1/lib/f0.py': No space left on device")
    size = log.stat().st_size
    assert size < 100_000, size  # 1.2 MB was 40,000 lines like these
    text = log.read_text()
    assert "copying the venv" in text and "f0.py" in text and "preserving times" in text  # its first and last lines
    assert re.search(r"\.\.\. [0-9,]+ lines of its output not logged", text), text[-2000:]


def test_lines_a_command_says_take_no_room_of_its_logged_output_nor_count_as_dropped(tmp_path: Path) -> None:
    """The lines a deploy shows of a command (`migrate:`, `sprite-os:`) are logged as they are said; they took
    the head's 300 places all the same, so a command that said many left its own first lines unlogged, and the
    count of lines not logged counted them too."""
    deploy = load_script("deploy")
    log = tmp_path / "deploy.log"
    deploy.out.open_log(log)
    script = ("for n in range(400): print(f'migrate: step {n}')\n"
              "for n in range(500): print(f'detail {n}')\n")
    deploy.run([sys.executable, "-c", script], "migrate-v1", echo=("migrate:",))
    text = log.read_text()
    assert "detail 0\n" in text and "detail 299\n" in text and "detail 300\n" not in text, text[:300]
    assert "... 100 lines of its output not logged" in text and "detail 399\n" not in text and "detail 400\n" in text
    assert len(re.findall(r"Z migrate: step [0-9]+\n", text)) == 400


def test_a_venv_copy_the_disk_has_no_room_for_is_refused_before_it_fills_the_disk(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A --venv-cache copy (about 475 MB) onto a disk without room for it filled the disk before failing:
    for as long as the copy ran, the serving server's own writes met a full disk (its turns not saved). The
    room the copy needs, with VENV_COPY_RESERVE left over, is now looked at first: refused in one line,
    nothing copied. A hard-linked copy needs no room and is not refused."""
    deploy = load_script("deploy")
    p, contract, release = release_on_the_lock(deploy, tmp_path)
    cache = tmp_path / "cache"
    stand_in_venv_with(cache / lock_hash(), "pkg/__init__.py")
    (cache / lock_hash() / "lib" / "big").write_bytes(b"x" * 3_000_000)
    ran: list[str] = []
    real_run = deploy.run
    monkeypatch.setattr(deploy, "run", lambda cmd, what, **kw: (ran.append(what), real_run(cmd, what, **kw)))
    free = deploy.VENV_COPY_RESERVE + 1_000_000  # room for a third of it, past the reserve
    monkeypatch.setattr(deploy.shutil, "disk_usage", lambda _: shutil._ntuple_diskusage(10**12, 10**12 - free, free))
    with pytest.raises(deploy.DeployError) as refused:
        deploy.ensure_venv(p, release, contract, None, cache)
    assert re.fullmatch(r"not enough room to copy the venv cache .*: it needs [0-9.]+ MB and [0-9.]+ MB more kept "
                        r"free, and [0-9.]+ MB is free; free some space, or pass --venv-cache-links", str(refused.value)), \
        refused.value
    assert ran == [] and list(p.venvs.iterdir()) == []
    assert deploy.ensure_venv(p, release, contract, None, cache, link=True) == (lock_hash(), "linked")
    # Given --venv-cache-links, and the links refused (the cache on another file system): the refusal does
    # not send the operator to the flag they gave.
    shutil.rmtree(p.venvs)

    def cannot_link(cmd: list[str], what: str, **kw: object) -> None:
        if "--link" in cmd:
            raise deploy.DeployError(f"{what} failed (exit 1): cp: cannot create hard link: Invalid cross-device link")
        real_run(cmd, what, **kw)
    monkeypatch.setattr(deploy, "run", cannot_link)
    with pytest.raises(deploy.DeployError) as refused:
        deploy.ensure_venv(p, release, contract, None, cache, link=True)
    assert "--venv-cache-links" not in str(refused.value) and "hard links" in str(refused.value), refused.value
    assert list(p.venvs.iterdir()) == []


def test_a_rollback_whose_restart_fails_too_says_both_and_what_is_current(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The new version did not start, and the previous one, switched back to, did not either (the
    port taken meanwhile, a full disk): the deploy said only the second restart's failure, not that
    it had rolled back, nor that nothing was serving. The steps before the restart are stand-ins."""
    deploy = load_script("deploy")
    p = deploy.Paths(tmp_path / "ws")
    p.releases.mkdir(parents=True)
    os.symlink("releases/1.0.0", p.current)
    contract = deploy.load_contract(REPO / "os_src")
    restarts = iter(["sprite-os: error: the server did not start: ModuleNotFoundError: x",
                     "sprite-os: error: port 8765 on 127.0.0.1 is already in use"])

    def restart(_: Any) -> None:
        raise deploy.DeployError(f"service restart failed (exit 1): {next(restarts)}")

    for name, stand_in in {"stage_release": lambda *_: (p.releases / "2.0.0", contract),
                           "agent_user": lambda *_: None, "ensure_venv": lambda *_: ("h", "reused"),
                           "check_start": lambda *_: None, "run_migrate": lambda *_: None, "write_templates": lambda *_: None,
                           "restore_templates": lambda *_: None, "ensure_links": lambda *_: None,
                           "isolate": lambda *_: None, "server_pid": lambda _: 4242,
                           "restart_service": restart}.items():
        monkeypatch.setattr(deploy, name, stand_in)
    monkeypatch.setattr(deploy.os, "sync", lambda: None)
    with pytest.raises(deploy.DeployError) as failed:
        deploy.deploy(deploy.parse_args(["--from-checkout", str(REPO)]), p)
    assert str(failed.value) == (
        "service restart failed (exit 1): sprite-os: error: the server did not start: ModuleNotFoundError: x; "
        "rolled back to 1.0.0, which did not start either (service restart failed (exit 1): sprite-os: error: "
        "port 8765 on 127.0.0.1 is already in use): nothing is serving")
    assert os.readlink(p.current) == "releases/1.0.0"


def stand_in_steps(deploy: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *,
                   current: str | None = "1.0.0", **steps: Any) -> Any:
    """The Paths of a workspace whose deploys stage and check for real, the venv being the suite's own
    python and the steps that would need a built one stand-ins (`steps` replace or add to them)."""
    p = deploy.Paths(tmp_path / "ws")
    p.releases.mkdir(parents=True)
    p.venvs.mkdir()
    os.symlink(sys.prefix, p.venvs / "stand-in")  # the suite's venv: the check runs its bin/python
    if current is not None:
        os.symlink(f"releases/{current}", p.current)
    stand_ins = {"agent_user": lambda *_: None, "ensure_venv": lambda *_: ("stand-in", "reused"),
                 "run_migrate": lambda *_: None, "write_templates": lambda *_: None,
                 "ensure_links": lambda *_: None, "isolate": lambda *_: None, "server_pid": lambda _: None}
    for name, stand_in in {**stand_ins, **steps}.items():
        monkeypatch.setattr(deploy, name, stand_in)
    monkeypatch.setattr(deploy.os, "sync", lambda: None)
    return p


def test_a_release_that_cannot_import_is_refused_before_the_switch(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A release that matches its MANIFEST but whose server module has a syntax error was switched to;
    with no server running (a Sprite asleep) the deploy said done, exit 0, and the Sprite failed at its
    next start. Its code is now imported by its venv's python before anything runs from it: refused,
    `current` unchanged; a good release still deploys. Staging and the check are real; the venv is the
    suite's python, and the steps that would need a built one are stand-ins."""
    deploy = load_script("deploy")
    ran: list[str] = []
    p = stand_in_steps(deploy, tmp_path, monkeypatch, run_migrate=lambda *_: ran.append("migrate"),
                       write_templates=lambda *_: ran.append("templates"))

    broken = make_checkout(tmp_path, "9.7.0")
    with (broken / "os_src" / "server.py").open("a") as f:
        f.write("\ndef broken(:\n")
    with pytest.raises(deploy.DeployError) as refused:
        deploy.deploy(deploy.parse_args(["--from-checkout", str(broken)]), p)
    said = str(refused.value)
    assert said.startswith("release 9.7.0 cannot start, nothing switched: SyntaxError: ") and "\n" not in said, said
    assert re.search(r"\(src/server\.py, line [0-9]+\)$", said), said
    assert os.readlink(p.current) == "releases/1.0.0" and not p.previous.is_symlink()
    assert ran == [] and not (p.releases / "9.7.0").exists()  # nothing ran from it; not kept for reuse
    assert "Traceback" in (p.shared.logs_dir / "deploy.log").read_text()  # the details are logged
    missing = make_checkout(tmp_path, "9.7.2")  # a dependency its venv lacks
    edited(missing / "os_src" / "server.py", ("\nimport asyncio\n", "\nimport asyncio\nimport not_in_the_lock\n"))
    with pytest.raises(deploy.DeployError) as refused:
        deploy.deploy(deploy.parse_args(["--from-checkout", str(missing)]), p)
    assert str(refused.value) == ("release 9.7.2 cannot start, nothing switched: "
                                  "ModuleNotFoundError: No module named 'not_in_the_lock'")
    assert os.readlink(p.current) == "releases/1.0.0" and ran == []

    good = make_checkout(tmp_path, "9.7.1")
    assert deploy.deploy(deploy.parse_args(["--from-checkout", str(good)]), p) == 0
    assert os.readlink(p.current) == "releases/9.7.1" and ran == ["migrate", "templates"]


def test_the_import_check_finds_a_late_import_and_stops_an_import_that_blocks(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The check imported the command entry and the server only: a syntax error in a module the server
    imports at the first turn (the agent's process) passed it, and was found by the person's first
    message. And an import that blocks (a network call at import) hung the deploy, holding its lock.
    Each is now refused, `current` unchanged."""
    deploy = load_script("deploy")
    p = stand_in_steps(deploy, tmp_path, monkeypatch)
    monkeypatch.setenv("SPRITE_OS_TOKEN", "secret-token-of-the-shell")

    late = make_checkout(tmp_path, "9.8.0")
    with (late / "os_src" / "agent" / "process.py").open("a") as f:
        f.write("\ndef broken(:\n")
    with pytest.raises(deploy.DeployError) as refused:
        deploy.deploy(deploy.parse_args(["--from-checkout", str(late)]), p)
    assert re.search(r"^release 9\.8\.0 cannot start, nothing switched: SyntaxError: .*\(src/agent/process\.py, "
                     r"line [0-9]+\)$", str(refused.value)), refused.value
    assert os.readlink(p.current) == "releases/1.0.0"

    blocks = make_checkout(tmp_path, "9.8.1")
    edited(blocks / "os_src" / "server.py", ("\nimport asyncio\n", "\nimport asyncio\nimport os as _os\n"
                                             "assert 'SPRITE_OS_TOKEN' not in _os.environ\n"
                                             "import time\ntime.sleep(90)\n"))
    monkeypatch.setattr(deploy, "CHECK_SECONDS", 3.0)
    began = time.monotonic()
    with pytest.raises(deploy.DeployError) as refused:
        deploy.deploy(deploy.parse_args(["--from-checkout", str(blocks)]), p)
    assert time.monotonic() - began < 45  # on a check with no bound: 90 s, then deployed
    assert str(refused.value) == "release 9.8.1 cannot start, nothing switched: still running after 3 s, stopped"
    assert os.readlink(p.current) == "releases/1.0.0" and not (p.releases / "9.8.1").exists()
    assert "secret-token-of-the-shell" not in (p.shared.logs_dir / "deploy.log").read_text()


def test_a_forced_restage_of_the_live_release_that_cannot_start_leaves_it_in_place(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--force` of the live version replaced releases/<V> with the re-staged copy before the import
    check: a copy that could not start was refused, "nothing switched", while `current` named it. It is
    now put in place only once checked; refused, the live copy is as it was and the staged one gone."""
    deploy = load_script("deploy")
    p = stand_in_steps(deploy, tmp_path, monkeypatch, current=None, collect_garbage=lambda _: ([], []))
    good = make_checkout(tmp_path, "9.9.0")
    assert deploy.deploy(deploy.parse_args(["--from-checkout", str(good)]), p) == 0
    live = (p.releases / "9.9.0" / "src" / "server.py").read_text()

    with (good / "os_src" / "server.py").open("a") as f:
        f.write("\ndef broken(:\n")
    with pytest.raises(deploy.DeployError, match=r"^release 9\.9\.0 cannot start, nothing switched: SyntaxError"):
        deploy.deploy(deploy.parse_args(["--from-checkout", str(good), "--force"]), p)
    assert os.readlink(p.current) == "releases/9.9.0"
    assert (p.releases / "9.9.0" / "src" / "server.py").read_text() == live
    assert sorted(entry.name for entry in p.releases.iterdir()) == ["9.9.0"]

    good = make_checkout(tmp_path / "again", "9.9.0")  # a good one re-staged with --force still replaces it
    edited(good / "os_src" / "server.py", ("\nimport asyncio\n", "\nimport asyncio\n# re-staged\n"))
    assert deploy.deploy(deploy.parse_args(["--from-checkout", str(good), "--force"]), p) == 0
    assert os.readlink(p.current) == "releases/9.9.0"
    assert "# re-staged" in (p.releases / "9.9.0" / "src" / "server.py").read_text()
    assert sorted(entry.name for entry in p.releases.iterdir()) == ["9.9.0"]


def test_a_forced_restage_of_a_release_running_but_not_current_leaves_it_in_place_until_checked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server runs 9.9.0 (a deploy of 9.9.1 with --no-restart made that current). `--force` of 9.9.0
    removed the running copy and put the re-staged one in its place before the import check: a copy that
    could not start was refused, yet kept (in use, and `previous`), the running server's lazy imports and
    the rollback target now the broken code. It is staged beside it now, and put in place only once checked."""
    deploy = load_script("deploy")
    restarts: list[str] = []
    p = stand_in_steps(deploy, tmp_path, monkeypatch, current=None, collect_garbage=lambda _: ([], []),
                       restart_service=lambda _: restarts.append(os.readlink(p.current)))
    running = make_checkout(tmp_path, "9.9.0")
    assert deploy.deploy(deploy.parse_args(["--from-checkout", str(running)]), p) == 0
    assert deploy.deploy(deploy.parse_args(["--from-checkout", str(make_checkout(tmp_path / "b", "9.9.1")),
                                            "--no-restart"]), p) == 0
    monkeypatch.setattr(deploy, "server_pid", lambda _: 4242)  # still running 9.9.0
    monkeypatch.setattr(deploy, "releases_in_use", lambda pid: {"9.9.0"} if pid == 4242 else set())
    live = p.releases / "9.9.0" / "src" / "server.py"
    before = (live.read_text(), live.stat().st_ino)

    with (running / "os_src" / "server.py").open("a") as f:
        f.write("\ndef broken(:\n")
    with pytest.raises(deploy.DeployError, match=r"^release 9\.9\.0 cannot start, nothing switched: SyntaxError"):
        deploy.deploy(deploy.parse_args(["--from-checkout", str(running), "--force"]), p)
    assert (live.read_text(), live.stat().st_ino) == before  # the running copy, untouched
    assert (os.readlink(p.current), os.readlink(p.previous)) == ("releases/9.9.1", "releases/9.9.0")
    assert sorted(entry.name for entry in p.releases.iterdir()) == ["9.9.0", "9.9.1"] and restarts == []

    good = make_checkout(tmp_path / "again", "9.9.0")  # a good one re-staged with --force replaces it
    edited(good / "os_src" / "server.py", ("\nimport asyncio\n", "\nimport asyncio\n# re-staged\n"))
    # The running copy is deleted only once the re-staged one is in its place: deleted first, the running
    # server's release was missing while the delete ran.
    rmtree, there_at_delete = shutil.rmtree, []
    monkeypatch.setattr(deploy.shutil, "rmtree", lambda path, *a, **k: (there_at_delete.append(live.exists()),
                                                                         rmtree(path, *a, **k)))
    assert deploy.deploy(deploy.parse_args(["--from-checkout", str(good), "--force"]), p) == 0
    monkeypatch.setattr(deploy.shutil, "rmtree", rmtree)
    assert there_at_delete and all(there_at_delete), there_at_delete
    assert "# re-staged" in live.read_text() and restarts == ["releases/9.9.0"]
    assert (os.readlink(p.current), os.readlink(p.previous)) == ("releases/9.9.0", "releases/9.9.1")
    assert sorted(entry.name for entry in p.releases.iterdir()) == ["9.9.0", "9.9.1"]


def test_a_release_staged_whole_whose_migrate_failed_is_migrated_again_and_a_rebuilt_one_staged_afresh(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A release staged whole whose migrate failed stays staged for the next deploy: deployed again, its
    migrate runs again (and its check), and it is switched to. But the next deploy reused that staged copy
    whatever release it was given: one rebuilt under the version (the migrate's bug fixed) ran the old
    staged code's migrate again and failed the same way, the fix never reached. The staged copy is reused
    only when its MANIFEST is the release's; else it is staged afresh (refused when that version is kept:
    current, previous or running)."""
    deploy = load_script("deploy")
    migrated: list[str] = []

    def migrate(_p: Any, release: Path, _h: str) -> None:
        migrated.append(release.name)
        if "# fixed" not in (release / "src" / "commands" / "migrate_v1.py").read_text():
            raise deploy.DeployError("migrate-v1 failed (exit 1): migrate: error: a bug in this release")
    p = stand_in_steps(deploy, tmp_path, monkeypatch, run_migrate=migrate, collect_garbage=lambda _: ([], []))
    buggy = make_checkout(tmp_path, "9.6.0")
    for _ in range(2):  # the staged copy is reused, and its migrate run again
        with pytest.raises(deploy.DeployError, match="a bug in this release"):
            deploy.deploy(deploy.parse_args(["--from-checkout", str(buggy)]), p)
        assert os.readlink(p.current) == "releases/1.0.0" and (p.releases / "9.6.0" / ".complete").is_file()
    assert migrated == ["9.6.0", "9.6.0"]

    fixed = make_checkout(tmp_path / "fixed", "9.6.0")
    with (fixed / "os_src" / "commands" / "migrate_v1.py").open("a") as f:
        f.write("# fixed\n")
    assert deploy.deploy(deploy.parse_args(["--from-checkout", str(fixed)]), p) == 0
    assert os.readlink(p.current) == "releases/9.6.0" and migrated[2:] == ["9.6.0"]
    assert "# fixed" in (p.releases / "9.6.0" / "src" / "commands" / "migrate_v1.py").read_text()

    os.symlink("releases/9.6.0", p.previous.with_name("previous.tmp"))  # 9.6.0 kept: previous now
    os.replace(p.previous.with_name("previous.tmp"), p.previous)
    os.symlink("releases/1.0.0", p.current.with_name("current.tmp"))
    os.replace(p.current.with_name("current.tmp"), p.current)
    with pytest.raises(deploy.DeployError, match=r"^this release of 9\.6\.0 is not the 9\.6\.0 staged"):
        deploy.deploy(deploy.parse_args(["--from-checkout", str(buggy)]), p)
    assert "# fixed" in (p.releases / "9.6.0" / "src" / "commands" / "migrate_v1.py").read_text()


def test_a_staged_release_damaged_since_is_staged_afresh_not_reused(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A release staged whole by a deploy that failed later was reused by the next deploy of it on its MANIFEST
    alone (the release given is that one): a file of the staged copy removed or changed since (by hand, a disk
    error) went with it, past the check when the check does not import it (a template, a tool compiled but not
    run), and every later deploy of that version reused it again. Its files are now checked against its
    MANIFEST first (byte-code and the deploy's own marks aside), and a damaged copy staged afresh (beside it, and
    put in place once checked, when it is kept)."""
    deploy = load_script("deploy")
    fail = ["migrate"]

    def migrate(*_: Any) -> None:
        if fail:
            raise deploy.DeployError("migrate-v1 failed (exit 1): migrate: error: the disk is full")
    p = stand_in_steps(deploy, tmp_path, monkeypatch, run_migrate=migrate, collect_garbage=lambda _: ([], []))
    checkout = make_checkout(tmp_path, "9.7.0")
    with pytest.raises(deploy.DeployError, match="the disk is full"):
        deploy.deploy(deploy.parse_args(["--from-checkout", str(checkout)]), p)
    staged = p.releases / "9.7.0"
    assert (staged / ".complete").is_file()
    (staged / "src" / "__pycache__").mkdir(exist_ok=True)  # as the byte-code cache a check or server leaves
    (staged / "src" / "__pycache__" / "deploy_contract.cpython-311.pyc").write_bytes(b"")
    inode = staged.stat().st_ino
    with pytest.raises(deploy.DeployError, match="the disk is full"):  # whole, its marks and byte-code beside it
        deploy.deploy(deploy.parse_args(["--from-checkout", str(checkout)]), p)
    assert staged.stat().st_ino == inode  # reused
    left_out = staged / "bootstrap" / "deploy.py"  # not imported by the check
    left_out.unlink()
    fail.clear()
    assert deploy.deploy(deploy.parse_args(["--from-checkout", str(checkout)]), p) == 0
    assert os.readlink(p.current) == "releases/9.7.0" and left_out.is_file()
    assert staged.stat().st_ino != inode  # staged afresh
    # One changed in place, and kept (previous now), is staged beside it and put in place once checked.
    os.replace(p.current, p.previous)
    (staged / "src" / "commands" / "migrate_v1.py").write_text("# changed in place\n")
    os.symlink("releases/1.0.0", p.current)
    assert deploy.deploy(deploy.parse_args(["--from-checkout", str(checkout)]), p) == 0
    assert "# changed in place" not in (staged / "src" / "commands" / "migrate_v1.py").read_text()


def test_the_running_release_is_known_in_a_workspace_under_a_folder_named_releases(tmp_path: Path) -> None:
    """The running server's release was the name after the first `releases` in its PYTHONPATH: for a
    workspace under /srv/releases/ that was the workspace's folder, so the server's own release was not
    known to be in use, and a refused check or the gc could remove it under the running server."""
    deploy = load_script("deploy")
    lib = tmp_path / "releases" / "ws" / ".os" / "releases" / "9.0.0" / "lib"
    server = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"],
                              env={**os.environ, "PYTHONPATH": f"/elsewhere:{lib}"}, stdout=subprocess.PIPE, text=True)
    try:
        # Once it runs: before its exec, the child's /proc environ is still this process's (the test failed
        # now and then under load, finding no release at all).
        assert server.stdout is not None and server.stdout.readline() == "up\n"
        assert deploy.releases_in_use(server.pid) == {"9.0.0"}
    finally:
        server.kill()
        server.wait()
        if server.stdout is not None:
            server.stdout.close()


def test_deploy_script_is_stdlib_only() -> None:
    """The first deploy of the suite runs deploy.py under `python3 -I -S`; here: it imports nothing else."""
    done = subprocess.run([sys.executable, "-I", "-S", "-c",
                           f"import sys, runpy; sys.argv = ['deploy.py', '--help']; "
                           f"runpy.run_path({str(DEPLOY)!r}, run_name='__main__')"],
                          capture_output=True, text=True)
    assert done.returncode == 0 and "--venv-cache" in done.stdout
    import ast

    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    for node in ast.walk(ast.parse(DEPLOY.read_text())):  # the script's own imports, not the code it hands a venv
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
        for name in names:
            assert name.split(".")[0] in stdlib, (node.lineno, name)


def test_deploy_and_the_server_share_one_workspace_layout(tmp_path: Path) -> None:
    """Where memory, state, logs, the token and the pid file live, and `.os`'s modes, are the
    contract's (Workspace): the server's Layout extends it, and deploy.py takes it from the release."""
    from sprite_os.deploy_contract import OS_DIR_MODE, PRIVATE_DIR_MODE, PRIVATE_DIRS
    from sprite_os.paths import Layout

    deploy = load_script("deploy")
    p = deploy.Paths(tmp_path / "ws")
    with pytest.raises(AssertionError, match="no release's facts"):
        _ = p.shared
    p.use(deploy.load_contract(REPO / "os_src"))
    layout = Layout(tmp_path / "ws")
    for name in ("os_dir", "memory_dir", "state_dir", "logs_dir", "backup_dir", "token_file", "service_env",
                 "pid_file", "deploy_lock"):
        assert getattr(p.shared, name) == getattr(layout, name), name
    script = DEPLOY.read_text()
    for name in ("memory", "state", "logs", "backup", "token", "server.pid", "0o711", "0o700"):
        assert f'"{name}"' not in script and f" {name})" not in script, name  # only the contract names them
    deploy.prepare(p)  # a deploy's first step, and the server's start, give .os the same modes
    modes = {path.name: path.stat().st_mode & 0o777 for path in (layout.os_dir, *(layout.os_dir / d for d in PRIVATE_DIRS))}
    layout.ensure()
    assert modes == {path.name: path.stat().st_mode & 0o777
                     for path in (layout.os_dir, *(layout.os_dir / d for d in PRIVATE_DIRS))}
    assert modes == {".os": OS_DIR_MODE, **dict.fromkeys(PRIVATE_DIRS, PRIVATE_DIR_MODE)}


def test_the_deploy_contract_is_stdlib_only_and_the_product_imports_it(tmp_path: Path) -> None:
    """os_src/deploy_contract.py is what deploy.py loads by path from a release, with the system
    python: it may import the standard library only, and nothing relative."""
    contract = REPO / "os_src" / "deploy_contract.py"
    stdlib = set(sys.stdlib_module_names)
    for node in ast.walk(ast.parse(contract.read_text())):
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0 and node.module and node.module.split(".")[0] in stdlib, ast.unparse(node)
        elif isinstance(node, ast.Import):
            assert all(alias.name.split(".")[0] in stdlib for alias in node.names), ast.unparse(node)
    # Loaded as a deploy loads it (python3 -I -S): it works, and brings in standard modules only.
    probe = f"""
import json, sys, tempfile
from pathlib import Path
sys.path.insert(0, {str(REPO / "bootstrap")!r})
import deploy
before = set(sys.modules)
c = deploy.load_contract(Path({str(REPO / "os_src")!r}))
target = Path({str(tmp_path / "f")!r})  # the test's own folder: removed with it
c.atomic_write(target, b"x", 0o640)
print(json.dumps({{"new": sorted(set(sys.modules) - before - {{c.__name__}}), "dirs": c.USER_SPACE_DIRS,
                  "files": list(c.MEMORY_FILES), "short": c.token_problem("x" * 15), "ok": c.token_problem("x" * 16),
                  "written": [target.read_text(), oct(target.stat().st_mode & 0o777)]}}))
"""
    done = subprocess.run([sys.executable, "-I", "-S", "-c", probe], capture_output=True, text=True, check=True)
    got = json.loads(done.stdout)
    assert [name for name in got["new"] if name.split(".")[0] not in stdlib] == []
    assert got["dirs"] == ["documents", "ocr", "extractions", "artifacts"]
    assert got["files"] == ["soul.md", "os.md", "tools.md", "files.md", "user.md", "context.md"]
    assert got["short"] == "must be at least 16 characters" and got["ok"] is None
    assert got["written"] == ["x", "0o640"]
    # The product imports the same facts the normal way: one definition, no copy.
    from sprite_os import config, deploy_contract, fsutil, paths
    from sprite_os.memory import files
    assert fsutil.atomic_write is deploy_contract.atomic_write
    assert fsutil.sync_dir is deploy_contract.sync_dir and fsutil.make_dirs is deploy_contract.make_dirs
    assert "os.fsync" not in DEPLOY.read_text()  # the folder fsync too: deploy.py held a copy of sync_dir
    assert paths.make_user_space is deploy_contract.make_user_space
    assert files.SPECS is deploy_contract.MEMORY_FILES
    assert config.token_problem is deploy_contract.token_problem
    assert config.MIN_TOKEN_LENGTH == deploy_contract.MIN_TOKEN_LENGTH


def edited(path: Path, *changes: tuple[str, str]) -> None:
    text = path.read_text()
    for old, new in changes:
        assert old in text, old
        text = text.replace(old, new)
    path.write_text(text)


def test_a_release_is_deployed_with_its_own_facts(venv: VenvCache, tmp_path: Path) -> None:
    """deploy.py holds no copy of the product's facts: this checkout's deploy.py deploys a release
    whose deploy_contract says otherwise (a renamed user folder, a longer token, a seventh memory
    file, an atomic write that keeps a log) with THAT release's facts, built, staged and no-op."""
    new = make_checkout(tmp_path, "9.6.0")
    edited(new / "os_src" / "deploy_contract.py",
           ('"extractions", "artifacts")', '"extractions", "outputs")'),
           ("MIN_TOKEN_LENGTH = 16", "MIN_TOKEN_LENGTH = 40"),
           ('        FileSpec("context.md",',
            '        FileSpec("notes.md", "daemon", 50, "Notes", "Nothing recorded yet."),\n        FileSpec("context.md",'),
           ("\ndef atomic_write(", "\ndef _atomic_write("))
    with (new / "os_src" / "deploy_contract.py").open("a") as f:
        f.write("\n\ndef atomic_write(path: Path, data: bytes, mode: int = 0o600) -> None:\n"
                "    with open(os.environ['RELEASE_WRITES'], 'a') as log:\n"
                "        log.write(f'{path}\\n')\n"
                "    _atomic_write(path, data, mode)\n")
    (new / "bootstrap" / "templates" / "notes.md").write_text("# Notes\n")
    writes = tmp_path / "writes.log"
    env = base_env(RELEASE_WRITES=str(writes))
    long_token, longer_token = tmp_path / "long-token", tmp_path / "longer-token"
    long_token.write_text("L" * 40 + "\n")
    longer_token.write_text("M" * 48 + "\n")

    tarball = load_script("build_release").build(new, tmp_path / "dist")  # this checkout's build_release.py
    with tarfile.open(tarball) as tf:
        assert "bootstrap/templates/notes.md" in tf.getnames()
    ws = tmp_path / "ws"
    refused = run_deploy(ws, "--release", str(tarball), "--token-file", str(token_file(tmp_path)), env=env)
    assert refused.returncode == 1 and "must be at least 40 characters" in refused.stderr, refused.stderr
    deploy_ok(ws, venv, "--release", str(tarball), "--token-file", str(long_token), env=env)
    assert (ws / "outputs").is_dir() and not (ws / "artifacts").exists()
    assert (ws / ".os" / "memory" / "notes.md").read_text() == "# Notes\n"
    assert (ws / ".os" / "token").read_text() == long_token.read_text()
    written = {Path(line).name for line in writes.read_text().splitlines()}
    assert {".complete", "sprite_os.pth", "sprite-os", "token"} <= written, written
    # The no-op path judges a token by the current release's rule too.
    refused = run_deploy(ws, "--release", str(tarball), "--token-file", str(token_file(tmp_path)), env=env)
    assert refused.returncode == 1 and "must be at least 40 characters" in refused.stderr, refused.stderr
    done = run_deploy(ws, "--release", str(tarball), "--token-file", str(longer_token), env=env)
    assert done.stdout == "deploy: already at 9.6.0\ndeploy: token installed\n", done.stdout + done.stderr
    assert (ws / ".os" / "token").read_text() == longer_token.read_text()
    # A release without a template its own facts name is not a release.
    (new / "bootstrap" / "templates" / "notes.md").unlink()
    done = run_deploy(tmp_path / "ws2", "--from-checkout", str(new), env=env)
    assert done.returncode == 1 and "notes.md" in done.stderr and "missing" in done.stderr, done.stderr


def test_lock_pins_the_runtime_dependencies() -> None:
    lock = load_script("lock")
    text = LOCK.read_text()
    assert lock.check(text, lock.project_dependencies()) == []
    pins = lock.locked(text)
    assert "claude-agent-sdk" in pins and "pydantic-core" in pins  # transitive ones too
    assert not {"pytest", "ruff", "aiohttp", "sprite-os"} & set(pins)  # no dev tools, not the project
    assert "python3 bootstrap/lock.py" in text.splitlines()[2]


def test_lock_check_names_a_missing_or_drifted_pin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """`lock.py --check`, what a maintainer runs after changing pyproject: 0 when the lock holds
    every pin, else 1 with one line per problem."""
    lock = load_script("lock")
    monkeypatch.setattr(sys, "argv", ["lock.py", "--check"])
    assert lock.main() == 0
    drifted = tmp_path / "requirements.lock"
    lines = [ln for ln in LOCK.read_text().splitlines() if not ln.startswith("msgspec==")]
    drifted.write_text("\n".join(ln.replace("websockets==", "websockets==0.") for ln in lines) + "\n")
    monkeypatch.setattr(lock, "LOCK", drifted)
    assert lock.main() == 1
    err = capsys.readouterr().err.splitlines()
    assert "lock: msgspec is not in the lock" in err
    assert any(e.startswith("lock: websockets is locked at 0.") and "pyproject pins" in e for e in err), err


# ---------------------------------------------------------------- a real turn through a deployed server


@pytest.mark.e2e
async def test_deployed_server_serves_a_turn(venv: VenvCache, tmp_path: Path, reachable_workspace: Path) -> None:
    from devkit.mock_bridge import MockBridge

    ws = reachable_workspace  # the deploy's user must reach it: the deployed server runs its CLI as that user
    token = token_file(tmp_path)
    # A user of its own: a deployed server's start kills every process of its agent's uid (leftovers),
    # and other tests' agents run as the run's agent user.
    user = {"SPRITE_AGENT_USER": base_env()["SPRITE_AGENT_USER"]}
    await asyncio.to_thread(deploy_ok, ws, venv, "--from-checkout", str(REPO), "--token-file", str(token),
                            env=base_env(**user))
    port = free_port()
    async with MockBridge() as bridge:
        env = base_env(SPRITE_OS_PORT=str(port), ANTHROPIC_BASE_URL=bridge.url, **user)
        started = await asyncio.to_thread(sprite_os, ws, "service", "start", env=env)
        assert started.returncode == 0, started.stdout + started.stderr
        try:
            pid = int((ws / ".os" / "state" / "server.pid").read_text())
            # The server is pinned to its release and venv, so a deploy switching `current` under it
            # changes nothing it imports later.
            assert f"/.os/venvs/{lock_hash()}/bin/python" in Path(f"/proc/{pid}/cmdline").read_text()
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            assert f"PYTHONPATH={ws}/.os/releases/{VERSION}/lib".encode() in environ
            headers = {"Authorization": f"Bearer {token.read_text().strip()}"}
            frames: list[dict[str, Any]] = []
            async with connect(f"ws://127.0.0.1:{port}", additional_headers=headers) as conn:
                await conn.send(json.dumps({"type": "hello"}))
                await conn.send(json.dumps({"type": "user_message", "text": "hi"}))
                async with asyncio.timeout(90):
                    while not frames or frames[-1]["type"] != "turn_complete":
                        frames.append(json.loads(await conn.recv()))
            assert frames[0]["type"] == "ready" and frames[0]["server_version"] == VERSION
            seqs = [f["seq"] for f in frames]
            assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
            assert frames[-1]["status"] == "completed"
            assert any(f["type"] == "assistant_message" and "hi" in f["text"] for f in frames)
            assert bridge.agent_requests(), "the real Claude Code CLI must have called the model"
            assert (healthz(port, ws) or {}).get("isolation") == "user"  # a deployed Sprite, as root
        finally:
            await asyncio.to_thread(stop_and_check, ws, env)
