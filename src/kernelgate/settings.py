"""Typed settings, read strictly from ``KERNELGATE_*`` environment variables.

==============================  ==============================================  ====================
variable                        meaning                                         default
==============================  ==============================================  ====================
``KERNELGATE_MODE``             ``auto``, ``reference``, ``triton`` or          ``auto``
                                ``check`` (auto, compared with the reference)
``KERNELGATE_INTERPRET``        run Triton kernels through Triton's             ``0``
                                interpreter (CPU tensors, pdb-steppable)
``KERNELGATE_LOG``              path of the CSV launch log; empty: off          off
``KERNELGATE_WARN``             warn once per (op, fallback reason)             ``1``
``KERNELGATE_TUNE``             ``on``: time candidates for a new shape          ``on``
                                bucket; ``off``: never time at run time
``KERNELGATE_TUNE_MARGIN``      how much faster than the reference a Triton     ``0.02``
                                candidate must be to replace it (0.02 = 2 %)
``KERNELGATE_CACHE_DIR``        where tuning decisions are kept                 user cache directory
``KERNELGATE_CHECK_EVERY``      in check mode, compare 1 call in N              ``1``
``KERNELGATE_CHECK_ACTION``     on a check mismatch: ``raise``, or ``demote``   ``raise``
                                (warn, and use the reference from then on)
``KERNELGATE_COMPILE_WORKERS``  processes compiling a new bucket's candidates  CPUs, at most 16
                                in parallel; 0: compile in the process only
``KERNELGATE_FAST_LAUNCH``      launch a kernel seen before through its         ``1``
                                compiled launcher; ``0``: Triton's launch path
==============================  ==============================================  ====================

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

__all__ = ["MODES", "CheckAction", "Mode", "Settings", "configure", "generation", "reload_settings", "settings"]

Mode = Literal["auto", "reference", "triton", "check"]
MODES: tuple[Mode, ...] = ("auto", "reference", "triton", "check")
CheckAction = Literal["raise", "demote"]
CHECK_ACTIONS: tuple[CheckAction, ...] = ("raise", "demote")

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def parse_mode(value: object, *, source: str) -> Mode:
    """Return ``value`` as a mode, or raise :class:`SettingsError` naming ``source``."""
    if isinstance(value, str) and value.strip().lower() in MODES:
        return cast(Mode, value.strip().lower())
    raise SettingsError(
        f"{source} must be one of {', '.join(MODES)}; got {value!r}. "
        f"Use 'auto' to let kernelgate choose, 'reference' for plain PyTorch, "
        f"'triton' to require the Triton kernels, 'check' to compare them with the reference."
    )


def _parse_bool(value: str, *, source: str) -> bool:
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise SettingsError(f"{source} must be one of 1, 0, true, false, yes, no, on, off; got {value!r}.")


def _parse_number(value: str, kind: type, *, source: str) -> float:
    try:
        return kind(value.strip())  # type: ignore[no-any-return]
    except ValueError as err:
        raise SettingsError(f"{source} must be {'an integer' if kind is int else 'a number'}; got {value!r}.") from err


@dataclasses.dataclass(frozen=True)
class Settings:
    """The process-wide settings of kernelgate (see the module docstring for the variables).

    Attributes:
        mode: ``auto`` (the fastest correct implementation for the shape, else the reference, with
            a recorded reason), ``reference`` (always plain PyTorch), ``triton`` (raise when no
            Triton implementation can run) or ``check`` (as ``auto``, and compare with the reference).
        interpret: run Triton implementations through Triton's interpreter, on CPU tensors too.
        log_path: CSV file that receives one row per call and per tuning event, or ``None``.
        warn_fallback: emit a :class:`~kernelgate.errors.FallbackWarning` once per (op, reason).
        tune: time the candidates of a new shape bucket; when off, use cached decisions, else the
            kernel's default configuration, and never time anything.
        tune_margin: fraction by which a Triton candidate must beat the reference to replace it (and, at
            least :data:`kernelgate.op.STEP_MARGIN`, by which kernelgate's Function must beat eager autograd's step).
        cache_dir: directory of the decision cache, or ``None`` for the user cache directory.
        check_every: in check mode, compare one call in this many.
        check_action: on a check mismatch, ``raise`` or ``demote`` the decision to the reference.
        compile_workers: processes that compile a new bucket's candidates in parallel before they
            are timed (:mod:`kernelgate.compile_ahead`); 0 compiles them in this process, one by
            one; ``None``: the CPUs this process may use, at most 16.
        fast_launch: launch a compiled kernel whose specialisation was launched before straight
            through its compiled launcher (:func:`kernelgate.backend.launch_compiled`); off: every
            launch takes Triton's own launch path.
    """

    mode: Mode = "auto"
    interpret: bool = False
    log_path: Path | None = None
    warn_fallback: bool = True
    tune: bool = True
    tune_margin: float = 0.02
    cache_dir: Path | None = None
    check_every: int = 1
    check_action: CheckAction = "raise"
    compile_workers: int | None = None
    fast_launch: bool = True

    def __post_init__(self) -> None:
        parse_mode(self.mode, source="mode")
        for name in ("interpret", "warn_fallback", "tune", "fast_launch"):
            if not isinstance(getattr(self, name), bool):
                raise SettingsError(f"{name} must be a bool; got {getattr(self, name)!r}.")
        for name in ("log_path", "cache_dir"):
            path = getattr(self, name)
            if isinstance(path, str):
                object.__setattr__(self, name, Path(path) if path.strip() else None)
            elif path is not None and not isinstance(path, Path):
                raise SettingsError(f"{name} must be a path, a string or None; got {type(path).__name__} {path!r}.")
        margin = self.tune_margin
        if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 <= margin < 1:
            raise SettingsError(f"tune_margin (KERNELGATE_TUNE_MARGIN) must be a number in [0, 1); got {margin!r}.")
        every = self.check_every
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise SettingsError(f"check_every (KERNELGATE_CHECK_EVERY) must be an integer >= 1; got {every!r}.")
        workers = self.compile_workers
        if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 0):
            raise SettingsError(
                f"compile_workers (KERNELGATE_COMPILE_WORKERS) must be an integer >= 0; got {workers!r}."
            )
        if self.check_action not in CHECK_ACTIONS:
            raise SettingsError(
                f"check_action (KERNELGATE_CHECK_ACTION) must be one of {', '.join(CHECK_ACTIONS)}; "
                f"got {self.check_action!r}."
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Read the settings from ``environ`` (default ``os.environ``), strictly."""
        env = os.environ if environ is None else environ
        return cls(
            mode=parse_mode(env.get("KERNELGATE_MODE", "auto"), source="KERNELGATE_MODE"),
            interpret=_parse_bool(env.get("KERNELGATE_INTERPRET", "0"), source="KERNELGATE_INTERPRET"),
            log_path=Path(log) if (log := env.get("KERNELGATE_LOG", "").strip()) else None,
            warn_fallback=_parse_bool(env.get("KERNELGATE_WARN", "1"), source="KERNELGATE_WARN"),
            tune=_parse_bool(env.get("KERNELGATE_TUNE", "on"), source="KERNELGATE_TUNE"),
            tune_margin=_parse_number(
                env.get("KERNELGATE_TUNE_MARGIN", "0.02"), float, source="KERNELGATE_TUNE_MARGIN"
            ),
            cache_dir=Path(cache) if (cache := env.get("KERNELGATE_CACHE_DIR", "").strip()) else None,
            check_every=int(
                _parse_number(env.get("KERNELGATE_CHECK_EVERY", "1"), int, source="KERNELGATE_CHECK_EVERY")
            ),
            check_action=cast(CheckAction, env.get("KERNELGATE_CHECK_ACTION", "raise").strip().lower()),
            compile_workers=int(_parse_number(workers, int, source="KERNELGATE_COMPILE_WORKERS"))
            if (workers := env.get("KERNELGATE_COMPILE_WORKERS", "").strip())
            else None,
            fast_launch=_parse_bool(env.get("KERNELGATE_FAST_LAUNCH", "1"), source="KERNELGATE_FAST_LAUNCH"),
        )


_current: Settings | None = None
_generation = 0


def settings() -> Settings:
    """Return the current settings, reading the environment on first use.

    >>> settings().mode in MODES
    True
    """
    global _current
    if _current is None:
        _current = Settings.from_env()
    return _current


def generation() -> int:
    """A number that changes whenever the settings change (memoised call plans depend on it)."""
    return _generation


def _set(new: Settings) -> Settings:
    global _current, _generation
    _current = new
    _generation += 1
    return new


def configure(**changes: object) -> Settings:
    """Change settings for this process and return the new settings.

    >>> old = settings(); _ = configure(mode="reference"); settings().mode
    'reference'
    >>> _ = configure(**dataclasses.asdict(old))
    """
    fields = {f.name for f in dataclasses.fields(Settings)}
    unknown = sorted(set(changes) - fields)
    if unknown:
        raise SettingsError(
            f"configure() got unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(fields))}."
        )
    if "mode" in changes:
        changes["mode"] = parse_mode(changes["mode"], source="mode")
    return _set(dataclasses.replace(settings(), **changes))  # type: ignore[arg-type]


def reload_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Read the settings from the environment again, dropping earlier :func:`configure` calls."""
    return _set(Settings.from_env(environ))
