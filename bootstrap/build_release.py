#!/usr/bin/env python3
"""Build the release tarball Bridge deploys: `python bootstrap/build_release.py --out dist`.

Writes dist/sprite-os-<VERSION>.tar.gz (and a .sha256 beside it) holding, at the top:
VERSION (first, so a deploy reads it without unpacking the rest), MANIFEST (the sha256 of every
other file: a deploy refuses a release that does not match it), requirements.lock,
bootstrap/ (deploy.py and the memory-file templates: those the checkout's own
os_src/deploy_contract.py names) and src/ (os_src without caches).
The tarball is reproducible: same checkout, same bytes (set SOURCE_DATE_EPOCH to stamp
its files with a date; the default is 1980-01-01). Stdlib only.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import os
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from deploy import (  # bootstrap/deploy.py, stdlib only
    MANIFEST,
    DeployError,
    manifest,
    release_entries,
)

DEFAULT_EPOCH = 315532800  # 1980-01-01T00:00:00Z


def build(checkout: Path, out_dir: Path) -> Path:
    entries = release_entries(checkout)
    version = (checkout / "VERSION").read_text().strip()
    mtime = int(os.environ.get("SOURCE_DATE_EPOCH", DEFAULT_EPOCH))
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        made: set[str] = set()
        listing = manifest(entries)
        for i, (name, path) in enumerate(entries):
            if i == 1:  # right after VERSION: a tarball cut short after it still names what it lacks
                tar.addfile(_info(MANIFEST, tarfile.REGTYPE, 0o644, len(listing), mtime), io.BytesIO(listing))
            parts = name.split("/")
            for depth in range(1, len(parts)):  # each folder once, before its first file
                folder = "/".join(parts[:depth])
                if folder not in made:
                    made.add(folder)
                    tar.addfile(_info(folder, tarfile.DIRTYPE, 0o755, 0, mtime))
            data = path.read_bytes()
            mode = 0o755 if name == "bootstrap/deploy.py" else 0o644
            tar.addfile(_info(name, tarfile.REGTYPE, mode, len(data), mtime), io.BytesIO(data))
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"sprite-os-{version}.tar.gz"
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_bytes(buf.getvalue())
    os.replace(tmp, target)
    digest = hashlib.sha256(buf.getvalue()).hexdigest()
    target.with_name(target.name + ".sha256").write_text(f"{digest}  {target.name}\n")
    return target


def _info(name: str, kind: bytes, mode: int, size: int, mtime: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size, info.mtime = kind, mode, size, mtime
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build dist/sprite-os-<VERSION>.tar.gz.")
    parser.add_argument("--out", default="dist", help="output folder (default: dist)")
    parser.add_argument("--checkout", default=str(Path(__file__).resolve().parent.parent),
                        help="the Sprite OS checkout to package (default: this one)")
    args = parser.parse_args(argv)
    try:
        target = build(Path(args.checkout), Path(args.out))
    except (DeployError, OSError) as exc:
        print(f"build_release: error: {exc}", file=sys.stderr)
        return 1
    size = target.stat().st_size
    print(f"build_release: wrote {target} ({size / 1024:.0f} KiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
