"""The CSV launch log: one row per call, appended safely by any number of processes.

Turn it on with ``KERNELGATE_LOG=path.csv`` or ``kernelgate.configure(log_path=...)``. Each row is written whole with
one ``write`` under an exclusive file lock, and the header is written once, by whichever process
finds the file empty. An I/O error warns once and turns the log off; it never reaches the caller.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import io
import os
import threading
import warnings
from datetime import datetime, timezone
from pathlib import Path

from kernelgate.errors import LogWriteWarning, user_stacklevel

try:
    import fcntl
except ImportError:  # Windows: rows are still written with one append each, without the lock
    fcntl = None  # type: ignore[assignment]

__all__ = ["COLUMNS", "SCHEMA_VERSION", "LogRow", "read", "write"]

SCHEMA_VERSION = 1


@dataclasses.dataclass(frozen=True)
class LogRow:
    """One launch-log row; ``COLUMNS`` gives the CSV's column order (bookkeeping fields first)."""

    op: str
    implementation: str
    config: str
    shapes: str
    dtypes: str
    device: str
    device_name: str
    capability: str
    torch_version: str
    triton_version: str
    kernelgate_version: str
    mode: str
    path: str
    reason: str
    wall_us: float
    schema_version: int = SCHEMA_VERSION
    timestamp: str = dataclasses.field(default_factory=lambda: datetime.now(timezone.utc).isoformat())
    pid: int = dataclasses.field(default_factory=os.getpid)


COLUMNS: tuple[str, ...] = (
    "schema_version",
    "timestamp",
    "pid",
    *(f.name for f in dataclasses.fields(LogRow) if f.name not in ("schema_version", "timestamp", "pid")),
)


class _Log:
    """The open log file; reopened when the configured path changes."""

    def __init__(self) -> None:
        self.path: Path | None = None
        self.fd: int | None = None
        self.failed: set[Path] = set()
        self.lock = threading.Lock()

    def _close(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
        self.fd, self.path = None, None

    def write(self, path: Path, row: LogRow) -> None:
        buffer = io.StringIO()
        csv.writer(buffer, lineterminator="\n").writerow(getattr(row, c) for c in COLUMNS)
        data = buffer.getvalue().encode()
        with self.lock:
            if path in self.failed:
                return
            try:
                if self.path != path:
                    self._close()
                    path.parent.mkdir(parents=True, exist_ok=True)
                    self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                    self.path = path
                assert self.fd is not None
                if fcntl is not None:
                    fcntl.flock(self.fd, fcntl.LOCK_EX)
                try:
                    if os.fstat(self.fd).st_size == 0:
                        data = (",".join(COLUMNS) + "\n").encode() + data
                    os.write(self.fd, data)
                finally:
                    if fcntl is not None:
                        fcntl.flock(self.fd, fcntl.LOCK_UN)
            except OSError as err:
                self.failed.add(path)
                self._close()
                warnings.warn(
                    f"kernelgate: cannot write the launch log {str(path)!r} ({err}); the log is off for the rest "
                    f"of this process. Point KERNELGATE_LOG (or configure(log_path=...)) at a writable file.",
                    LogWriteWarning,
                    stacklevel=user_stacklevel(),
                )


_log = _Log()


def write(path: Path, row: LogRow) -> None:
    """Append ``row`` to the CSV file ``path``; never raises (an I/O error warns once, then the log is off)."""
    _log.write(path, row)


def read(path: str | os.PathLike[str]) -> list[dict[str, str]]:
    """Read a launch log back as a list of dicts (one per row), e.g. for a report.

    >>> read("/nonexistent.csv")
    []
    """
    try:
        with open(path, newline="") as f:
            return list(csv.DictReader(f))
    except FileNotFoundError:
        return []
