"""Downloads: the server's peak memory while 16 clients download a 99 MiB file at once.

A download is read a chunk at a time from one descriptor and the gateway handles a client's next
request only once its unread answers are back under a bound, so the server's memory grows by a few
chunks per download, not by the file.
The clients run in their own process (bench/download_clients.py); the server's peak resident set
(VmHWM, reset just before through /proc/self/clear_refs) is measured against its resident set
before they start.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from devkit.harness import TOKEN, make_settings, running

MIB = 1024 * 1024


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM starts again from the resident set now


def _status(field: str) -> int:
    """A /proc/self/status figure, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


async def downloads(clients: int = 16, size: int = 99 * MIB) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="sprite-bench-downloads-") as tmp:
        settings = make_settings(Path(tmp) / "workspace", "http://127.0.0.1:9")
        async with running(settings, memory=False) as app:
            target = app.settings.layout.root / "documents" / "big.bin"
            digest = hashlib.sha256()
            with target.open("wb") as out:
                for _ in range(size // MIB):
                    block = os.urandom(MIB)
                    digest.update(block)
                    out.write(block)
            _reset_peak()
            before = _status("VmRSS")
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "bench.download_clients", str(app.port), TOKEN, str(clients),
                "documents/big.bin", stdout=asyncio.subprocess.PIPE)
            out, _ = await asyncio.wait_for(proc.communicate(), 900)
            peak = _status("VmHWM")
    result = json.loads(out)
    assert result["sha256"] == [digest.hexdigest()] * clients, "a download's bytes differ from the file's"
    return {"clients": clients, "file_mib": size // MIB, "rss_before_mib": round(before / MIB, 1),
            "peak_growth_mib": round((peak - before) / MIB, 1), "seconds": result["seconds"],
            "mib_per_s": round(clients * size / MIB / result["seconds"], 1),
            "chunks_sent_again_for_rate": result["retries"]}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(downloads()), indent=1))
