"""A content-addressed cache of rendered outputs, so regenerating unchanged inputs costs a hash and a read.

Keys are sha256 digests of everything an output depends on: the exportsmith and codemods source (the tool
fingerprint), the transformers version, and the input files' paths and contents. A changed input or a changed
codemod is a different key, so entries never need invalidating; stale ones are just never read again.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from functools import cache
from pathlib import Path

import codemods

from . import __version__


def default_directory() -> Path:
    configured = os.environ.get("EXPORTSMITH_CACHE_DIR")
    if configured:
        return Path(configured)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "exportsmith"


# Modules that never influence what generation renders: editing them must not invalidate the cache.
NOT_RENDERING = ("verify", "cli.py", "__main__.py")


def rendering_files() -> list[tuple[str, Path]]:
    """(name, path) of every file that renders: exportsmith's engine, the codemods and their data files
    (cond_targets.json), in a fixed order."""
    files = []
    for package in (Path(__file__).parent, Path(codemods.__file__).parent):
        for path in sorted([*package.rglob("*.py"), *package.rglob("*.json")]):
            if path.relative_to(package).parts[0] not in NOT_RENDERING:
                files.append((path.relative_to(package).as_posix(), path))
    return files


@cache
def tool_fingerprint() -> str:
    """A digest of the source that renders (exportsmith's engine and the codemods): any change to it changes every
    key."""
    digest = hashlib.sha256(__version__.encode())
    for name, path in rendering_files():
        digest.update(name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def key(*parts: str | bytes) -> str:
    digest = hashlib.sha256(tool_fingerprint().encode())
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        digest.update(len(data).to_bytes(8, "little"))  # length-prefixed: no two part lists collide
        digest.update(data)
    return digest.hexdigest()


class ContentCache:
    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory or default_directory()

    def _path(self, name: str) -> Path:
        return self.directory / name[:2] / f"{name}.json"

    def get(self, name: str):
        try:
            return json.loads(self._path(name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    def put(self, name: str, value) -> None:
        """Best effort and atomic: a cache that cannot be written only costs speed."""
        path = self._path(name)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, encoding="utf-8") as handle:
                json.dump(value, handle)
            os.replace(handle.name, path)
        except OSError:
            pass
