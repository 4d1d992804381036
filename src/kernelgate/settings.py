"""Typed settings, read strictly from ``KERNELGATE_*`` environment variables.

===========================  ===========================================  =========
variable                     meaning                                      default
===========================  ===========================================  =========
``KERNELGATE_MODE``          ``auto``, ``reference`` or ``triton``        ``auto``
``KERNELGATE_INTERPRET``     run Triton kernels through Triton's          ``0``
                             interpreter (CPU tensors, pdb-steppable)
``KERNELGATE_LOG``           path of the CSV launch log; empty: off       off
``KERNELGATE_WARN``          warn once per (op, fallback reason)          ``1``
===========================  ===========================================  =========

The environment is read once, on first use; :func:`configure` changes settings for the process
and :func:`reload_settings` reads the environment again.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Literal, cast

from kernelgate.errors import SettingsError

__all__ = ["MODES", "Mode", "Settings", "configure", "reload_settings", "settings"]

Mode = Literal["auto", "reference", "triton"]
MODES: tuple[Mode, ...] = ("auto", "reference", "triton")

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def parse_mode(value: object, *, source: str) -> Mode:
    """Return ``value`` as a mode, or raise :class:`SettingsError` naming ``source``."""
    if isinstance(value, str) and value.strip().lower() in MODES:
        return cast(Mode, value.strip().lower())
    raise SettingsError(
        f"{source} must be one of {', '.join(MODES)}; got {value!r}. "
        f"Use 'auto' to let kernelgate choose, 'reference' for plain PyTorch, "
        f"'triton' to require the Triton kernels."
    )


def _parse_bool(value: str, *, source: str) -> bool:
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise SettingsError(f"{source} must be one of 1, 0, true, false, yes, no, on, off; got {value!r}.")


@dataclasses.dataclass(frozen=True)
class Settings:
    """The process-wide settings of kernelgate.

    Attributes:
        mode: which path calls take: ``auto`` (Triton where it can run, else the reference, with a
            recorded reason), ``reference`` (always plain PyTorch) or ``triton`` (raise when no
            Triton implementation can run).
        interpret: run Triton implementations through Triton's interpreter, on CPU tensors too.
        log_path: CSV file that receives one row per call, or ``None`` for no log.
        warn_fallback: emit a :class:`~kernelgate.errors.FallbackWarning` once per (op, reason).
    """

    mode: Mode = "auto"
    interpret: bool = False
    log_path: Path | None = None
    warn_fallback: bool = True

    def __post_init__(self) -> None:
        parse_mode(self.mode, source="mode")
        for name in ("interpret", "warn_fallback"):
            if not isinstance(getattr(self, name), bool):
                raise SettingsError(f"{name} must be a bool; got {getattr(self, name)!r}.")
        path = self.log_path
        if isinstance(path, str):
            object.__setattr__(self, "log_path", Path(path) if path.strip() else None)
        elif path is not None and not isinstance(path, Path):
            raise SettingsError(f"log_path must be a path, a string or None; got {type(path).__name__} {path!r}.")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Read the settings from ``environ`` (default ``os.environ``), strictly."""
        env = os.environ if environ is None else environ
        log = env.get("KERNELGATE_LOG", "").strip()
        return cls(
            mode=parse_mode(env.get("KERNELGATE_MODE", "auto"), source="KERNELGATE_MODE"),
            interpret=_parse_bool(env.get("KERNELGATE_INTERPRET", "0"), source="KERNELGATE_INTERPRET"),
            log_path=Path(log) if log else None,
            warn_fallback=_parse_bool(env.get("KERNELGATE_WARN", "1"), source="KERNELGATE_WARN"),
        )


_current: Settings | None = None


def settings() -> Settings:
    """Return the current settings, reading the environment on first use.

    >>> settings().mode in MODES
    True
    """
    global _current
    if _current is None:
        _current = Settings.from_env()
    return _current


def configure(**changes: object) -> Settings:
    """Change settings for this process and return the new settings.

    >>> old = settings(); _ = configure(mode="reference"); settings().mode
    'reference'
    >>> _ = configure(**dataclasses.asdict(old))
    """
    global _current
    fields = {f.name for f in dataclasses.fields(Settings)}
    unknown = sorted(set(changes) - fields)
    if unknown:
        raise SettingsError(
            f"configure() got unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(fields))}."
        )
    if "mode" in changes:
        changes["mode"] = parse_mode(changes["mode"], source="mode")
    _current = dataclasses.replace(settings(), **changes)  # type: ignore[arg-type]
    return _current


def reload_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Read the settings from the environment again, dropping earlier :func:`configure` calls."""
    global _current
    _current = Settings.from_env(environ)
    return _current
