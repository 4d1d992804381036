"""Benchmark suites: the shapes and dtypes ``kernelgate bench`` measures, read from JSON.

A suite file (the built-in one is ``shapes.json`` beside this module)::

    {
      "schema": 1,
      "dtypes": ["float32", "bfloat16"],
      "shapes": {
        "rowwise": [
          {"target_bytes": 134217728, "row_lengths": [1024, 4096]},
          {"shapes": [[64, 4096]]}
        ],
        "cross_entropy": [{"shapes": [[8192, 32000]]}]
      },
      "quick": {"rowwise": [{"shapes": [[64, 4096]]}]}
    }

Each key of ``shapes`` names a shape family of the bench specs (``rowwise``, ``cross_entropy``,
``rotary``) or one op; an op's own group, when present, replaces its family's. A group lists entries
of fixed ``shapes``, or ``row_lengths`` with a ``target_bytes``: the row count is then chosen so the
op's main input is about that many bytes in each dtype. ``quick`` holds the groups ``--quick`` uses
instead. A user file replaces the built-in suite, or with ``"extend": true`` adds its groups to it
(and its ``dtypes``, if given, replace the built-in ones).

>>> suite = default_suite()
>>> suite.dtypes
('float32', 'bfloat16')
>>> [case.shape for case in suite.cases("softmax", "rowwise", ("M", "N"), "bfloat16")][:2]
[(524288, 128), (131072, 512)]
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch

from kernelgate.errors import BenchError

__all__ = ["DEFAULT_SUITE_PATH", "DTYPES", "BenchError", "Case", "ShapeGroup", "Suite", "default_suite", "load_suite"]

SUITE_SCHEMA = 1
DEFAULT_SUITE_PATH = Path(__file__).with_name("shapes.json")
DTYPES: Mapping[str, torch.dtype] = MappingProxyType(
    {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
)
_TOP_KEYS = ("schema", "description", "dtypes", "shapes", "quick", "extend")
_ENTRY_KEYS = ("shapes", "row_lengths", "target_bytes")


@dataclasses.dataclass(frozen=True)
class ShapeGroup:
    """One entry of a suite group: fixed shapes, or row lengths sized to a byte target."""

    shapes: tuple[tuple[int, ...], ...] = ()
    row_lengths: tuple[int, ...] = ()
    target_bytes: int = 0


@dataclasses.dataclass(frozen=True)
class Case:
    """One shape to measure; ``target_bytes`` is the byte target its row count came from (0: fixed)."""

    shape: tuple[int, ...]
    target_bytes: int = 0


@dataclasses.dataclass(frozen=True)
class Suite:
    """Dtypes and shape groups (keyed by shape family or op name)."""

    dtypes: tuple[str, ...]
    groups: Mapping[str, tuple[ShapeGroup, ...]]
    source: str = "built-in"

    def cases(self, op: str, family: str, dims: Sequence[str], dtype: str) -> list[Case]:
        """The shapes ``op`` (of ``family``, shapes named ``dims``) is measured at in ``dtype``.

        Raises:
            BenchError: a group's shapes do not fit the op's dimensions.
        """
        key = op if op in self.groups else family
        element = torch.empty((), dtype=DTYPES[dtype]).element_size()
        cases: list[Case] = []
        for group in self.groups.get(key, ()):
            for shape in group.shapes:
                if len(shape) != len(dims):
                    raise BenchError(
                        f"{self.source}: shapes[{key!r}] holds {list(shape)}, but {op} shapes have {len(dims)} "
                        f"sizes ({', '.join(dims)}). Give {op} its own group with shapes of that form."
                    )
                cases.append(Case(shape))
            if group.row_lengths and len(dims) != 2:
                raise BenchError(
                    f"{self.source}: shapes[{key!r}] gives row_lengths, but {op} shapes have {len(dims)} sizes "
                    f"({', '.join(dims)}), not rows x row length. Give fixed 'shapes' instead."
                )
            for n in group.row_lengths:
                cases.append(Case((max(1, group.target_bytes // (n * element)), n), group.target_bytes))
        unique: dict[tuple[int, ...], Case] = {}
        for case in cases:
            unique.setdefault(case.shape, case)
        return list(unique.values())


_REMEDY = f"The built-in suite {DEFAULT_SUITE_PATH} shows the format (docs/bench.md describes it)."


def _fail(source: str, where: str, expected: str, got: object) -> BenchError:
    return BenchError(f"{source}: {where} must be {expected}; got {got!r}. {_REMEDY}")


def _positive_ints(value: object, source: str, where: str) -> tuple[int, ...]:
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
    ):
        raise _fail(source, where, "a non-empty list of positive integers", value)
    return tuple(value)


def _parse_groups(data: object, source: str, where: str, known: Sequence[str]) -> dict[str, tuple[ShapeGroup, ...]]:
    if not isinstance(data, dict):
        raise _fail(source, where, "an object mapping a shape family or op name to a list of entries", data)
    groups: dict[str, tuple[ShapeGroup, ...]] = {}
    for key, entries in data.items():
        if key not in known:
            raise BenchError(
                f"{source}: {where} has a group {key!r}, which names neither a shape family nor an op with a bench "
                f"spec; use one of {', '.join(known)}."
            )
        if not isinstance(entries, list):
            raise _fail(source, f"{where}[{key!r}]", "a list of entries", entries)
        parsed = []
        for i, entry in enumerate(entries):
            at = f"{where}[{key!r}][{i}]"
            if not isinstance(entry, dict):
                raise _fail(source, at, "an object with 'shapes', or 'row_lengths' and 'target_bytes'", entry)
            unknown = sorted(set(entry) - set(_ENTRY_KEYS))
            if unknown:
                raise BenchError(
                    f"{source}: {at} has unknown key(s) {', '.join(map(repr, unknown))}; an entry takes "
                    f"{', '.join(_ENTRY_KEYS)}. {_REMEDY}"
                )
            shapes: tuple[tuple[int, ...], ...] = ()
            if "shapes" in entry:
                if not isinstance(entry["shapes"], list) or not entry["shapes"]:
                    expected = "a non-empty list of shapes (lists of positive integers)"
                    raise _fail(source, f"{at}.shapes", expected, entry["shapes"])
                shapes = tuple(_positive_ints(s, source, f"{at}.shapes[{j}]") for j, s in enumerate(entry["shapes"]))
            row_lengths: tuple[int, ...] = ()
            target = 0
            if "row_lengths" in entry or "target_bytes" in entry:
                row_lengths = _positive_ints(entry.get("row_lengths"), source, f"{at}.row_lengths")
                target_value = entry.get("target_bytes")
                if not isinstance(target_value, int) or isinstance(target_value, bool) or target_value <= 0:
                    expected = "a positive integer (bytes of the main input)"
                    raise _fail(source, f"{at}.target_bytes", expected, target_value)
                target = target_value
            if not shapes and not row_lengths:
                raise _fail(source, at, "an object with 'shapes', or 'row_lengths' and 'target_bytes'", entry)
            parsed.append(ShapeGroup(shapes, row_lengths, target))
        groups[key] = tuple(parsed)
    return groups


def parse_suite(data: object, source: str, *, quick: bool = False, base: Suite | None = None) -> Suite:
    """A suite from parsed JSON; ``base`` is what a file with ``"extend": true`` adds to.

    Raises:
        BenchError: naming the file, the entry, what was expected and what was found.
    """
    from kernelgate.bench.specs import SPECS

    known = list(dict.fromkeys([s.family for s in SPECS] + [s.op for s in SPECS]))
    if not isinstance(data, dict):
        raise _fail(source, "the file", "a JSON object with 'schema', 'dtypes' and 'shapes'", type(data).__name__)
    if data.get("schema") != SUITE_SCHEMA:
        raise _fail(source, "'schema'", str(SUITE_SCHEMA), data.get("schema"))
    unknown = sorted(set(data) - set(_TOP_KEYS))
    if unknown:
        raise BenchError(
            f"{source}: unknown key(s) {', '.join(map(repr, unknown))}; a suite file takes {', '.join(_TOP_KEYS)}. "
            f"{_REMEDY}"
        )
    extend = data.get("extend", False)
    if not isinstance(extend, bool):
        raise _fail(source, "'extend'", "true or false", extend)
    dtypes: tuple[str, ...] | None = None
    if "dtypes" in data:
        value = data["dtypes"]
        if not isinstance(value, list) or not value or not all(isinstance(d, str) and d in DTYPES for d in value):
            raise _fail(source, "'dtypes'", f"a non-empty list of {', '.join(DTYPES)}", value)
        dtypes = tuple(value)
    section = "quick" if quick and "quick" in data else "shapes"
    if section not in data:
        raise _fail(source, f"{section!r}", "present", None)
    groups = _parse_groups(data[section], source, f"'{section}'", known)
    if extend and base is not None:
        merged = dict(base.groups)
        for key, entries in groups.items():
            merged[key] = merged.get(key, ()) + entries
        groups = merged
        dtypes = dtypes or base.dtypes
    if dtypes is None:
        raise _fail(source, "'dtypes'", "given (the file does not extend the built-in suite)", None)
    return Suite(dtypes, MappingProxyType(groups), source)


def _read_json(text: str, source: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise BenchError(
            f"{source}: not valid JSON ({err.msg} at line {err.lineno}, column {err.colno}). {_REMEDY}"
        ) from err


def default_suite(quick: bool = False) -> Suite:
    """The built-in suite (``shapes.json``, shipped with the package); ``quick`` for its short variant."""
    text = importlib.resources.files("kernelgate.bench").joinpath("shapes.json").read_text()
    return parse_suite(_read_json(text, "built-in suite"), "built-in suite", quick=quick)


def load_suite(path: Path | str, *, quick: bool = False) -> Suite:
    """Read a suite file; with ``"extend": true`` it adds to the built-in suite (its quick variant if ``quick``).

    Raises:
        BenchError: the file cannot be read or does not describe a suite.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise BenchError(f"cannot read the suite file {str(path)!r} ({err}); give the path of a JSON suite.") from err
    return parse_suite(_read_json(text, str(path)), str(path), quick=quick, base=default_suite(quick))
