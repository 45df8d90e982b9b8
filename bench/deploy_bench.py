"""Deploy and migration figures, measured in one run: `python -m bench.deploy_bench`.

`run()` returns seconds (and rows/s) for:
- fresh_deploy_s: a first deploy into an empty workspace that builds the venv for real
  (python -m venv + pip install -r requirements.lock from a local wheelhouse, no index);
- fresh_deploy_venv_cache_s: the same with --venv-cache (a venv Bridge pre-baked), copied;
- fresh_deploy_venv_cache_links_s: the same with --venv-cache-links (hard links, same filesystem);
- update_deploy_s: deploying a new version with the same lock (the venv is reused);
- noop_redeploy_s: the median of 5 redeploys of the version already current (the lazy path);
- migrate_*: `sprite-os migrate-v1` on a generated v1 workspace with 100,000 observations
  and realistic learnings, pending actions and sessions (copy, FTS rebuild, verification, move).

The wheelhouse is downloaded once (pip download) into the tests' cache folder and reused.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from devkit.deploy_support import (
    REPO,
    base_env,
    lock_hash,
    make_checkout,
    make_v1_workspace,
    run_deploy,
    wheelhouse,
)

OBSERVATIONS = 100_000
LEARNINGS = 20_000  # about one learning per five turns
ACTIONS = 2_000


def _timed_deploy(workspace: Path, *args: str) -> tuple[float, str]:
    started = time.perf_counter()
    done = run_deploy(workspace, *args)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"deploy failed: {done.stdout}{done.stderr}")
    return seconds, done.stdout


def run() -> dict[str, Any]:
    cache_root = REPO / ".pytest_cache" / "d" / "sprite-os-deploy"
    cache_root.mkdir(parents=True, exist_ok=True)
    houses = wheelhouse(cache_root)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="sprite-os-deploy-bench-") as tmp:
        root = Path(tmp)

        fresh = root / "fresh"
        results["fresh_deploy_s"], _ = _timed_deploy(fresh, "--from-checkout", str(REPO), "--wheelhouse", str(houses))
        cache = root / "venv-cache"
        cache.mkdir()
        subprocess.run(["cp", "-a", str(fresh / ".os" / "venvs" / lock_hash()), str(cache / lock_hash())], check=True)

        cached = root / "cached"
        results["fresh_deploy_venv_cache_s"], _ = _timed_deploy(
            cached, "--from-checkout", str(REPO), "--venv-cache", str(cache))

        linked = root / "linked"
        results["fresh_deploy_venv_cache_links_s"], _ = _timed_deploy(
            linked, "--from-checkout", str(REPO), "--venv-cache", str(cache), "--venv-cache-links")
        shutil.rmtree(linked)

        noops = [_timed_deploy(cached, "--from-checkout", str(REPO))[0] for _ in range(5)]
        results["noop_redeploy_s"] = statistics.median(noops)

        new = make_checkout(root, "999.0.0")
        results["update_deploy_s"], _ = _timed_deploy(cached, "--from-checkout", str(new))
        shutil.rmtree(fresh)
        shutil.rmtree(cached)

        v1_root = root / "v1"
        started = time.perf_counter()
        data = make_v1_workspace(v1_root, observations=OBSERVATIONS, learnings=LEARNINGS, actions=ACTIONS)
        results["migrate_generate_s"] = time.perf_counter() - started
        results["migrate_v1_db_mb"] = (v1_root / "agent.db").stat().st_size / 1e6
        rows = sum(data.counts.values())
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "sprite_os", "migrate-v1"], capture_output=True, text=True,
                              env=base_env(SPRITE_WORKSPACE=str(v1_root)), cwd=REPO)
        seconds = time.perf_counter() - started
        if done.returncode != 0:
            raise RuntimeError(f"migrate-v1 failed: {done.stderr}")
        results.update({
            "migrate_observations": data.counts["observations"],
            "migrate_rows": rows,
            "migrate_100k_s": seconds,
            "migrate_rows_per_s": rows / seconds,
            "migrate_observations_per_s": data.counts["observations"] / seconds,
        })
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in results.items()}


if __name__ == "__main__":
    os.chdir(REPO)
    print(json.dumps(run(), indent=2))
