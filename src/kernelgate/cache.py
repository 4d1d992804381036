"""The persistent decision cache: which implementation and configuration won, per key.

Plain JSON in ``KERNELGATE_CACHE_DIR`` (default: the user cache directory), never pickle. Writes
take an inter-process lock, re-read the file, merge, write a temporary file and rename it over the
old one, so processes tuning at once lose no entries and tear none. A corrupt or unreadable file is
reported once and rebuilt; entries are validated against the op's declaration by the caller before
use, so an edited or hostile file can neither inject a configuration nor crash a launch.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
import warnings
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import Any

from kernelgate.errors import CacheWarning, user_stacklevel

__all__ = ["SCHEMA", "DecisionCache", "decision_cache", "default_cache_dir"]

SCHEMA = 1
FILE_NAME = f"decisions-v{SCHEMA}.json"


def default_cache_dir() -> Path:
    """The user cache directory for kernelgate (``~/.cache/kernelgate`` on Linux)."""
    import platformdirs

    return Path(platformdirs.user_cache_dir("kernelgate", appauthor=False))


class DecisionCache:
    """Decisions keyed by a string, held in memory and mirrored to ``<directory>/decisions-v1.json``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / FILE_NAME
        self._entries: dict[str, dict[str, Any]] | None = None
        self._lock = threading.Lock()
        self._warned: set[str] = set()

    # --- reading ---------------------------------------------------------------------------------

    def _warn_once(self, what: str, message: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            warnings.warn(f"kernelgate: {message}", CacheWarning, stacklevel=user_stacklevel())

    def _read_file(self) -> dict[str, dict[str, Any]]:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        except OSError as err:
            self._warn_once("unreadable", f"cannot read the decision cache {str(self.path)!r} ({err}); tuning anew.")
            return {}
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("entries"), dict):
                raise ValueError(f"expected an object with schema {SCHEMA} and entries")
        except ValueError as err:
            self._warn_once("corrupt", f"the decision cache {str(self.path)!r} is corrupt ({err}); it will be rebuilt.")
            return {}
        return {k: v for k, v in data["entries"].items() if isinstance(k, str) and isinstance(v, dict)}

    def entries(self) -> dict[str, dict[str, Any]]:
        """All entries (loaded from the file on first use)."""
        with self._lock:
            if self._entries is None:
                self._entries = self._read_file()
            return self._entries

    def get(self, key: str) -> dict[str, Any] | None:
        """The raw entry for ``key``, or ``None``. Validate it before use."""
        entries = self._entries if self._entries is not None else self.entries()
        return entries.get(key)

    # --- writing ---------------------------------------------------------------------------------

    def put(self, key: str, entry: Mapping[str, Any]) -> None:
        """Store ``entry`` under ``key`` in memory and in the file (merged with other processes' entries)."""
        self.update({key: dict(entry)})

    def update(self, new: Mapping[str, dict[str, Any]], *, replace_all: bool = False) -> None:
        """Store several entries at once; ``replace_all`` drops every other entry (``cache clear``)."""
        entries = self.entries()
        with self._lock:
            entries.update(new)
            self._write(new, replace_all)

    def remove(self, keys: Iterable[str]) -> int:
        """Drop the entries under ``keys`` (memory and file; other processes' entries are kept); return how many
        of them the file held. Their buckets are tuned again on their next call."""
        gone = set(keys)
        entries = self.entries()
        with self._lock:
            for key in gone:
                entries.pop(key, None)
            return self._write({}, False, gone)

    def _write(self, new: Mapping[str, dict[str, Any]], replace_all: bool, drop: Collection[str] = ()) -> int:
        """:meth:`_write_merged`, or where the file cannot be written, a warning (once) and 0."""
        try:
            return self._write_merged(new, replace_all, drop)
        except OSError as err:
            self._warn_once(
                "unwritable",
                f"cannot write the decision cache {str(self.path)!r} ({err}); decisions are kept in memory "
                f"only. Point KERNELGATE_CACHE_DIR at a writable directory.",
            )
            return 0

    def _write_merged(self, new: Mapping[str, dict[str, Any]], replace_all: bool, drop: Collection[str] = ()) -> int:
        """Merge ``new`` into the file's entries, less those under ``drop``; return how many were dropped."""
        from filelock import FileLock

        self.directory.mkdir(parents=True, exist_ok=True)
        with FileLock(str(self.path) + ".lock", timeout=60):
            merged = {} if replace_all else self._read_file()
            dropped = sum(merged.pop(key, None) is not None for key in drop)
            merged.update(new)
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".decisions-", suffix=".tmp")
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump({"schema": SCHEMA, "entries": merged}, f, indent=1, sort_keys=True)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        if self._entries is not None:
            if replace_all:
                self._entries.clear()
            for key in drop:
                self._entries.pop(key, None)
            self._entries.update(merged)
        return dropped

    def clear(self) -> int:
        """Remove every entry (memory and file); return how many there were."""
        count = len(self.entries())
        with self._lock:
            self._entries = {}
        self.update({}, replace_all=True)
        return count

    def export(self, path: Path) -> int:
        """Write every entry to ``path`` (same format as the cache file); return the count."""
        entries = self.entries()
        path.write_text(json.dumps({"schema": SCHEMA, "entries": entries}, indent=1, sort_keys=True))
        return len(entries)

    def import_file(self, path: Path) -> int:
        """Merge the entries of an exported file into the cache; return how many were read.

        Raises:
            ValueError: the file is not a kernelgate decision file.
        """
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("entries"), dict):
            raise ValueError(f"{path} is not a kernelgate decision file (schema {SCHEMA})")
        entries = {k: v for k, v in data["entries"].items() if isinstance(k, str) and isinstance(v, dict)}
        for entry in entries.values():
            entry["source"] = "imported"
        self.update(entries)
        return len(entries)


_caches: dict[Path, DecisionCache] = {}
_caches_lock = threading.Lock()


def decision_cache(directory: Path | None) -> DecisionCache:
    """The process's cache object for ``directory`` (``None``: the user cache directory)."""
    path = directory if directory is not None else default_cache_dir()
    with _caches_lock:
        cache = _caches.get(path)
        if cache is None:
            cache = _caches[path] = DecisionCache(path)
        return cache
