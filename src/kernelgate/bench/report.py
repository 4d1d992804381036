"""Benchmark results: the CSV schema, and what is made from it (plots, a markdown summary, tables).

The CSV has one row per (op, dtype, shape, direction, implementation); :class:`BenchRow` is its
schema and :data:`COLUMNS` its column order. Every row carries its provenance, so rows from
different runs can be put side by side.

>>> COLUMNS[:4]
('schema_version', 'op', 'dtype', 'shape')
"""

from __future__ import annotations

import collections
import csv
import dataclasses
import gzip
import json
import math
import re
import statistics
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from kernelgate.bench.suite import DTYPES, BenchError
from kernelgate.dispatch import Reason

# Inputs below this are the latency regime, timed for host cost too (noise hides bandwidth there).
# The suite's latency shapes reach 16 MiB (512x4096 float32, two inputs); its bandwidth shapes
# hold about 128 MiB per input.
LATENCY_BYTES = 64 * 2**20

__all__ = [
    "COLUMNS",
    "SCHEMA_VERSION",
    "TARGETS",
    "BenchRow",
    "Provenance",
    "Targets",
    "effective_us",
    "misses",
    "plots_available",
    "print_table",
    "read_csv",
    "read_runs",
    "record_run",
    "write_csv",
    "write_plots",
    "write_summary",
]

SCHEMA_VERSION = 1
FORWARD, FORWARD_BACKWARD = "forward", "forward+backward"
PEERS = ("eager", "compile", "liger")


@dataclasses.dataclass(frozen=True)
class Provenance:
    """Where and how a run measured: the same for every row of the run."""

    device: str
    gpu: str
    driver: str
    torch_version: str
    triton_version: str
    kernelgate_version: str
    kernelgate_commit: str
    liger_version: str
    timer: str
    copy_gbps: float
    started: str


@dataclasses.dataclass(frozen=True)
class BenchRow:
    """One measurement. Times in microseconds; NaN where not measured.

    Attributes:
        op, dtype: the op and the dtype of its floating-point inputs.
        shape: the suite shape, ``"16384x4096"`` (its dimensions are named in docs/bench.md).
        rows, row_length: the shape seen as rows (the x axis of the plots is the row length).
        regime: ``bandwidth`` (inputs of LATENCY_BYTES or more) or ``latency``.
        target_bytes: the byte target the row count was derived from (0 for a fixed shape).
        direction: ``forward`` or ``forward+backward``.
        impl: ``eager``, ``compile``, ``kernelgate``, ``triton:<implementation>`` or ``liger``.
        status: ``ok``, ``skipped`` (not measurable here; ``note`` says why) or ``error``.
        time_us: median time of one call (GPU: ``do_bench``, L2 flushed).
        host_us: per call over many calls issued back to back then one synchronise: the steady
            state, where host and device overlap (latency shapes; and forward+backward at
            bandwidth shapes on a GPU, where it is reported beside ``time_us``, not instead).
        bytes, byte_formula: the minimal bytes moved, and how they are counted.
        gbps, frac_of_copy: ``bytes / time``, and that over the run's copy bandwidth.
        peak_mib: peak memory allocated during one call, above what was allocated before it.
        first_call_ms: the first call's time (compilation, tuning, Triton JIT); kernelgate's
            forward includes planning its bucket, which tunes it when new.
        note: the implementation kernelgate chose, a tuned config, or why a row was skipped.
    """

    op: str
    dtype: str
    shape: str
    rows: int
    row_length: int
    regime: str
    target_bytes: int
    direction: str
    impl: str
    status: str
    time_us: float
    host_us: float
    bytes: int
    byte_formula: str
    gbps: float
    copy_gbps: float
    frac_of_copy: float
    peak_mib: float
    first_call_ms: float
    note: str
    device: str
    gpu: str
    driver: str
    torch_version: str
    triton_version: str
    kernelgate_version: str
    kernelgate_commit: str
    liger_version: str
    timer: str
    started: str
    schema_version: int = SCHEMA_VERSION


COLUMNS: tuple[str, ...] = (
    "schema_version",
    *(f.name for f in dataclasses.fields(BenchRow) if f.name != "schema_version"),
)
_TYPES = {f.name: f.type for f in dataclasses.fields(BenchRow)}


def write_csv(rows: Iterable[BenchRow], path: Path) -> Path:
    """Write ``rows`` with a header of :data:`COLUMNS`; returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow(dataclasses.asdict(row))
    return path


def read_csv(path: Path) -> list[BenchRow]:
    """Read a CSV written by :func:`write_csv`, or one gzip-compressed (a name ending ``.gz``: the large results
    kept in the repository).

    Raises:
        BenchError: the file is missing, or is not a bench CSV of this schema version.
    """
    try:
        with gzip.open(path, "rt", newline="") if path.suffix == ".gz" else path.open(newline="") as f:
            reader = csv.DictReader(f)
            header = tuple(reader.fieldnames or ())
            records = list(reader)
    except OSError as err:
        raise BenchError(f"cannot read {str(path)!r} ({err}); give a CSV written by kernelgate bench.") from err
    if header != COLUMNS:
        missing = [c for c in COLUMNS if c not in header]
        raise BenchError(
            f"{path}: not a kernelgate bench CSV of schema {SCHEMA_VERSION} (missing columns: "
            f"{', '.join(missing) or 'none, but the order differs'}). Write it again with kernelgate bench."
        )
    rows = []
    for line, record in enumerate(records, start=2):
        try:
            if int(record["schema_version"]) != SCHEMA_VERSION:
                raise ValueError(f"schema_version {record['schema_version']}, expected {SCHEMA_VERSION}")
            values = {
                name: int(text) if _TYPES[name] == "int" else float(text) if _TYPES[name] == "float" else text
                for name, text in record.items()
            }
        except (TypeError, ValueError) as err:
            raise BenchError(f"{path}, line {line}: {err}. Write the CSV again with kernelgate bench.") from err
        rows.append(BenchRow(**values))  # type: ignore[arg-type]
    return rows


# --- reading results -------------------------------------------------------------------------------


def effective_us(row: BenchRow) -> float:
    """What a caller feels per call: at latency shapes the larger of the device time and the host cost."""
    if row.regime != "latency" or math.isnan(row.host_us):
        return row.time_us
    return max(row.time_us, row.host_us)


def steady_fraction(row: BenchRow) -> float:
    """Fraction of copy bandwidth with calls issued back to back (``host_us``), NaN where not measured."""
    if math.isnan(row.host_us) or row.host_us <= 0 or not row.copy_gbps:
        return math.nan
    return row.bytes / (row.host_us * 1e-6) / 1e9 / row.copy_gbps


def _ok(rows: Iterable[BenchRow]) -> list[BenchRow]:
    return [r for r in rows if r.status == "ok" and not math.isnan(r.time_us)]


def _impl_order(impls: Iterable[str]) -> list[str]:
    fixed = ["eager", "compile", "liger", "kernelgate"]
    names = set(impls)
    return [i for i in fixed if i in names] + sorted(n for n in names if n not in fixed)


def _cases(rows: Sequence[BenchRow]) -> dict[tuple[str, str, str, str], dict[str, BenchRow]]:
    """(op, dtype, direction, shape) -> impl -> row, in first-seen order."""
    cases: dict[tuple[str, str, str, str], dict[str, BenchRow]] = {}
    for r in _ok(rows):
        cases.setdefault((r.op, r.dtype, r.direction, r.shape), {})[r.impl] = r
    return cases


def _best_peer(by_impl: dict[str, BenchRow]) -> BenchRow | None:
    peers = [by_impl[p] for p in PEERS if p in by_impl]
    return min(peers, key=effective_us) if peers else None


@dataclasses.dataclass(frozen=True)
class Targets:
    """What kernelgate aims for (fractions of copy bandwidth, ratios, microseconds)."""

    forward_fraction: float = 0.90
    forward_backward_fraction: float = 0.80
    versus_best_peer: float = 0.97
    versus_eager: float = 1.03
    host_over_triton_us: float = 2.0


TARGETS = Targets()


@dataclasses.dataclass(frozen=True)
class _Miss:
    """One missed target: where, which target (``bandwidth``, ``peer``, ``eager`` or ``host``), the
    cause found (``autograd``: the autograd step, not the kernels; ``kernels``: the kernels alone
    are short; ``""``: none named) and the sentence the summary prints."""

    op: str
    dtype: str
    direction: str
    shape: str
    target: str
    cause: str
    text: str


def misses(rows: Sequence[BenchRow], targets: Targets = TARGETS) -> list[str]:
    """Where kernelgate misses a target, one sentence each (see docs/bench.md for the targets)."""
    return [m.text for m in _find_misses(rows, targets)]


# The words of miss_breakdown for each target and each cause the summary names (its digest's columns).
_TARGET_WORDS = {
    "bandwidth": "below the bandwidth target",
    "peer": "behind the best peer",
    "eager": "slower than eager",
    "host": "over the host-cost target",
}
_CAUSE_WORDS = {
    "reference": "the reference's call plus dispatch",
    "kernels": "kernels short of the target",
    "field": "no implementation reaching it",
    "autograd": "the autograd step",
    "timed": "a step timed faster once",
    "call": "its kernel faster alone",
    "tuning": "tuning's choice",
}


def miss_breakdown(rows: Sequence[BenchRow], targets: Targets = TARGETS) -> str:
    """The misses counted by target, then by the cause the summary names, most first; ``""`` where none is missed.

    >>> miss_breakdown([])
    ''
    """
    found = _find_misses(rows, targets)
    if not found:
        return ""
    by_target = collections.Counter(m.target for m in found)
    by_cause = collections.Counter(m.cause for m in found if m.cause)
    text = ", ".join(f"{n} {_TARGET_WORDS[t]}" for t, n in by_target.most_common())
    if by_cause:
        text += "; causes: " + ", ".join(f"{n} {_CAUSE_WORDS[c]}" for c, n in by_cause.most_common())
    unnamed = len(found) - sum(by_cause.values())
    return text + (f"; {unnamed} with no cause named" if unnamed else "")


# A case: (op, dtype, shape), the key of a kernel note.
KernelNotes = dict[tuple[str, str, str], str]


def kernel_cases(rows: Sequence[BenchRow], targets: Targets = TARGETS) -> list[tuple[str, str, str, str]]:
    """The forward cases at bandwidth shapes below the bandwidth target where kernelgate ran a Triton candidate:
    ``(op, dtype, shape, candidate label)``, whose kernels' resources (:mod:`kernelgate.bench.resources`) may say
    why."""
    found = []
    for (op, dtype, direction, shape), by_impl in _cases(rows).items():
        ours = by_impl.get("kernelgate")
        chosen = _CHOSEN.match(ours.note) if ours is not None else None
        if (
            ours is not None
            and chosen is not None
            and chosen.group(1) != "reference"
            and direction == FORWARD
            and ours.regime == "bandwidth"
            and ours.frac_of_copy < targets.forward_fraction
        ):
            found.append((op, dtype, shape, chosen.group(1)))
    return found


def _find_misses(
    rows: Sequence[BenchRow], targets: Targets = TARGETS, kernel_notes: KernelNotes | None = None
) -> list[_Miss]:
    """Every missed target of kernelgate in ``rows``, with its cause where the run shows one; ``kernel_notes``
    (per :func:`kernel_cases` case) end the bandwidth misses of those cases."""
    found: list[_Miss] = []
    for (op, dtype, direction, shape), by_impl in _cases(rows).items():
        ours = by_impl.get("kernelgate")
        if ours is None:
            continue
        where = f"{op} {dtype} {shape} {direction}"
        here: list[tuple[str, str]] = []
        floor = targets.forward_fraction if direction == FORWARD else targets.forward_backward_fraction
        if ours.regime == "bandwidth" and ours.frac_of_copy < floor:
            here.append(
                (
                    "bandwidth",
                    f"{where}: kernelgate reaches {ours.frac_of_copy:.2f} of copy bandwidth (target {floor:.2f})",
                )
            )
        peer = _best_peer(by_impl)
        if peer is not None and effective_us(peer) / effective_us(ours) < targets.versus_best_peer:
            here.append(
                (
                    "peer",
                    f"{where}: kernelgate {effective_us(ours):.1f} us is {effective_us(peer) / effective_us(ours):.2f} "
                    f"of the speed of {peer.impl} {effective_us(peer):.1f} us (target {targets.versus_best_peer:.2f})",
                )
            )
        eager = by_impl.get("eager")
        if eager is not None and effective_us(ours) > targets.versus_eager * effective_us(eager):
            here.append(
                (
                    "eager",
                    f"{where}: kernelgate {effective_us(ours):.1f} us is slower than eager "
                    f"{effective_us(eager):.1f} us by more than {targets.versus_eager - 1:.0%}",
                )
            )
        direct = [r.host_us for name, r in by_impl.items() if name.startswith("triton:") and not math.isnan(r.host_us)]
        over = ours.host_us - min(direct) if direct else math.nan
        if direction == FORWARD and over > targets.host_over_triton_us:
            here.append(
                (
                    "host",
                    f"{where}: kernelgate host cost {ours.host_us:.1f} us per call is more than "
                    f"{targets.host_over_triton_us:g} us over a direct Triton launch ({min(direct):.1f} us)",
                )
            )
        step = _step_path(ours.note) if direction == FORWARD_BACKWARD else None
        cause, clause = _own_kernel_cause(ours, by_impl, floor) if direction == FORWARD else ("", "")
        if not cause and direction == FORWARD:
            cause, clause = _tuning_cause(op, dtype, shape, ours, by_impl)
            if cause:  # and where nothing measured reaches the target either, that too
                clause += _field_cause(by_impl, floor)[1] if ours.regime == "bandwidth" else ""
        if not cause and step is not None and step.path == "eager":
            cause, clause = _eager_step_cause(ours, eager, step, by_impl)
        if not cause and direction == FORWARD_BACKWARD:
            cause, clause = _autograd_gap(ours, by_impl, floor)
        if not cause and (step is None or step.path == "eager"):  # a Function step ran no eager autograd
            cause, clause = _reference_cause(ours, eager)
        if not cause and ours.regime == "bandwidth":
            cause, clause = _field_cause(by_impl, floor)
        if direction == FORWARD_BACKWARD and ours.regime == "bandwidth":
            clause += _steady_state(ours, by_impl)
        # Slower than eager after a timing chose the Function: that timing is the cause of this target.
        timed = _timed_function_cause(ours, step, eager, targets)
        note = (kernel_notes or {}).get((op, dtype, shape), "") if direction == FORWARD else ""
        for target, text in here:
            if target == "eager" and timed[0]:
                found.append(_Miss(op, dtype, direction, shape, target, timed[0], text + timed[1]))
            else:
                text += clause + (note if target == "bandwidth" else "")
                found.append(_Miss(op, dtype, direction, shape, target, cause, text))
    return found


# kernelgate's forward row names the candidate it ran ("auto: single_block[ROWS=1,num_warps=1] (tuned); ..."), and
# that candidate's own row starts with the same label ("single_block[ROWS=1,num_warps=1]; tuned 68.0 us").
_CHOSEN = re.compile(r"^auto: ([A-Za-z_]\w*(?:\[[^\]]*\])?) \(")
# How much slower kernelgate may be than its own chosen kernel's row before the summary names that as the cause:
# at bandwidth shapes kernelgate's dispatch is under 1 % of the call.
OWN_KERNEL_RATIO = 1.10


def _chosen_row(ours: BenchRow, by_impl: dict[str, BenchRow]) -> tuple[str, BenchRow] | None:
    """The Triton candidate kernelgate ran in this case (its label) and that candidate's own row, where the case has
    a row of the same configuration; else ``None``."""
    chosen = _CHOSEN.match(ours.note)
    if chosen is None:
        return None
    label = chosen.group(1)
    same = by_impl.get("triton:" + label.split("[")[0])
    return (label, same) if same is not None and same.note.startswith(label + ";") else None


def _own_kernel_cause(ours: BenchRow, by_impl: dict[str, BenchRow], floor: float) -> tuple[str, str]:
    """A forward miss where kernelgate ran a Triton candidate whose own row in the same case was more than
    :data:`OWN_KERNEL_RATIO` times faster, or reached the bandwidth target ``floor`` where kernelgate's call did not:
    the kernel is not the cause, the difference is in kernelgate's call as timed there (``("call", clause)``); else
    ``("", "")``.

    Only at bandwidth shapes, where kernelgate's dispatch is a small part of the call. On the H200 this marked,
    for example, softmax float32 16384x2048 at 4207c1c: 116 us through kernelgate, 68 us for the same
    configuration's own row, with torch.compile and Liger-Kernel also at half their usual speed in that case. On an
    H100 at 97469f7, cross_entropy bfloat16 8192x32000: 194.0 us through kernelgate (0.895 of copy), 192.3 us (0.903)
    in the same configuration's own row: a gap within two timings' spread, whose miss named no cause before.
    """
    found = _chosen_row(ours, by_impl) if ours.regime == "bandwidth" else None
    if found is None:
        return "", ""
    label, same = found
    if ours.time_us > OWN_KERNEL_RATIO * same.time_us:
        return "call", (
            f"; kernelgate ran {label}, whose own row in this case took {same.time_us:.1f} us "
            f"({same.frac_of_copy:.2f} of copy): the kernel is not the cause, the difference is in kernelgate's call "
            "as timed here"
        )
    if ours.frac_of_copy < floor <= same.frac_of_copy:
        return "call", (
            f"; kernelgate ran {label}, whose own row in this case took {same.time_us:.1f} us "
            f"({same.frac_of_copy:.3f} of copy, the target met): the kernel is not the cause; kernelgate's call, "
            f"{ours.time_us:.1f} us ({ours.frac_of_copy:.3f}), was {ours.time_us / same.time_us - 1:.1%} slower as "
            "timed here"
        )
    return "", ""


# How much faster than the candidate kernelgate ran another implementation's own row (at its tuned configuration,
# in the same case) must be before the summary names tuning's decision as the cause: implementations within 10 % of
# each other swap places between runs (tuning picks among near-equal ones), beyond it the run contradicts tuning.
TUNING_RATIO = 1.10
# A Triton row's note gives tuning's own time for its configuration ("split_rows[...]; tuned 256.2 us").
_TUNED_US = re.compile(r"^[^;]*; tuned ([0-9.]+) us")


def _tuning_cause(op: str, dtype: str, shape: str, ours: BenchRow, by_impl: dict[str, BenchRow]) -> tuple[str, str]:
    """A forward miss where kernelgate ran a Triton candidate whose own row in the same case is more than
    :data:`TUNING_RATIO` times slower than another implementation's row: the decision is the cause, since tuning
    timed them the other way round (``("tuning", clause)``, with tuning's own times and the command that decides
    the bucket again); else ``("", "")``.

    On the H200 at e19bd2b, rms_norm bfloat16 512x131072: tuning timed looped at 145.5 us and split_rows at 256.2,
    and chose looped; the run measured looped at 122.9 us and split_rows at 88.9.
    """
    found = _chosen_row(ours, by_impl)
    if found is None:
        return "", ""
    label, same = found
    others = [r for name, r in by_impl.items() if name.startswith("triton:") and r is not same and r.status == "ok"]
    best = min((r for r in others if not math.isnan(r.time_us)), key=lambda r: r.time_us, default=None)
    if best is None or same.time_us <= TUNING_RATIO * best.time_us:
        return "", ""

    def in_tuning(row: BenchRow) -> str:
        found = _TUNED_US.match(row.note)
        return f", {found.group(1)} us in tuning" if found else ""

    return "tuning", (
        f"; tuning chose {label} ({same.time_us:.1f} us in its own row here{in_tuning(same)}), but {best.impl} ran "
        f"{best.note.split(';')[0]} in {best.time_us:.1f} us here{in_tuning(best)}: this run contradicts tuning's "
        f"timings, so the decision is the cause (`kernelgate tune {op} --shape {shape} --dtype {dtype} --retune` "
        "decides the bucket again)"
    )


@dataclasses.dataclass(frozen=True)
class _StepPath:
    """The path kernelgate's forward+backward steps took, as its row's note says (``Op.step_route``)."""

    path: str  # "function", "eager" or "undecided"
    detail: str
    eager_us: float = math.nan  # the timed steps, where the path was timed
    function_us: float = math.nan


_STEP_NOTE = re.compile(r"; autograd step: (function|eager|undecided): (.*)$")
_STEP_TIMES = re.compile(r"eager autograd ([0-9.]+) us, through kernelgate's Function ([0-9.]+) us")
# The device's time per step, where the step route measured it (Op._eager_step_wins_on_the_device).
_STEP_DEVICE_TIMES = re.compile(r"eager autograd ([0-9.]+) us a step, the Function ([0-9.]+) us;")


def _step_path(note: str) -> _StepPath | None:
    """The step path named in a kernelgate forward+backward row's note; ``None`` where the note names none
    (rows written before the bench recorded it)."""
    found = _STEP_NOTE.search(note)
    if found is None:
        return None
    times = _STEP_TIMES.search(found.group(2))
    if times is None:
        return _StepPath(found.group(1), found.group(2))
    return _StepPath(found.group(1), found.group(2), float(times.group(1)), float(times.group(2)))


def _eager_step_cause(
    ours: BenchRow, eager: BenchRow | None, step: _StepPath, by_impl: dict[str, BenchRow]
) -> tuple[str, str]:
    """A forward+backward miss whose steps ran eager autograd of the reference: the step is eager's plus
    kernelgate's dispatch (counted with the reference's cause). Where the step route timed the step both ways and the
    case has ``triton:*`` rows (the forward, then the tuned backward, called directly), the fastest says whether the
    kernels would have been faster: then the Function's step lost its timing to its host time, not its kernels."""
    if eager is None:
        return "", ""
    extra = effective_us(ours) - effective_us(eager)
    clause = (
        f"; its steps ran eager autograd of the reference ({step.detail}), so the step is eager's plus "
        f"kernelgate's dispatch: {extra:+.1f} us"
    )
    kernels = [r for name, r in by_impl.items() if name.startswith("triton:") and not math.isnan(effective_us(r))]
    if kernels and not math.isnan(step.function_us):  # a timed step (not one where both passes run the reference)
        best = min(kernels, key=effective_us)
        clause += (
            f"; its own kernels, forward and backward called directly, took {effective_us(best):.1f} us ({best.impl}"
            + (f", {best.frac_of_copy:.2f} of copy" if best.regime == "bandwidth" else "")
            + (
                "): faster than eager's step, so the Function's step lost that timing to its host time, not its kernels"
                if effective_us(best) < effective_us(eager)
                else "): no faster than eager's step"
            )
        )
    return "reference", clause


def _timed_function_cause(
    ours: BenchRow, step: _StepPath | None, eager: BenchRow | None, targets: Targets
) -> tuple[str, str]:
    """Where the step was timed once and kernelgate's Function kept, but measured here slower than eager:
    ``("timed", clause)`` with both timings; else ``("", "")``. Where the device's time per step kept it, the
    clause gives those times and the steps back to back.

    The timing that kept the Function ran steps back to back, as a training loop does. Where the row's own steps
    issued back to back (``host_us``) are within the eager target of eager's, the clause says the choice holds in
    that regime, and that this measurement (L2 flushed before each step, the GPU then idle, or held for the timer's
    hold) adds the host's time past that to the device's, or, where the hold grew past each step's issue time, that
    the time measured is the device's; otherwise, that the Function's host time varies from step to step.
    """
    if step is None or step.path != "function" or math.isnan(step.function_us):
        return "", ""
    on_device = _STEP_DEVICE_TIMES.search(step.detail) if "the device's time decides" in step.detail else None
    if on_device is not None:  # kept by the device's time, though slower back to back
        return "timed", (
            f"; its step was timed once on the device, the host's time hidden, at {float(on_device.group(2)):.1f} us "
            f"through kernelgate's Function against eager autograd's {float(on_device.group(1)):.1f} us, so the "
            f"Function was kept (back to back, where its host time counts, {step.function_us:.1f} us against "
            f"{step.eager_us:.1f}), but measured here it took {effective_us(ours):.1f} us"
        )
    timing = (
        f"; its step was timed once through kernelgate's Function at {step.function_us:.1f} us against eager "
        f"autograd's {step.eager_us:.1f} us, so the Function was kept, but measured here it took "
        f"{effective_us(ours):.1f} us"
    )
    steady = eager is not None and not math.isnan(ours.host_us) and not math.isnan(eager.host_us)
    if steady and eager is not None and ours.host_us <= targets.versus_eager * eager.host_us:
        held = _HOLD.search(ours.timer)
        if held is not None and held.group(2) is not None:  # the hold covered each step's issue
            here = (
                "here each step starts after an L2 flush and the GPU held past its host issue time, so the time "
                "measured is the device's, and the Function's step takes the longer there"
            )
        else:
            here = (
                f"here each step starts {_start_of_each_step(ours.timer)}, and the Function's longer host time adds "
                "to the device's"
            )
        return "timed", (
            f"{timing}. With steps issued back to back, the regime that timing chose for, it took {ours.host_us:.1f} "
            f"us against eager's {eager.host_us:.1f}: the choice holds there; {here}"
        )
    return "timed", f"{timing}: the Function's host time varies from step to step"


# The timer's hold after each L2 flush, as kernelgate.bench.run writes it ("... then the GPU held 100 us ..."), and
# since the hold grew with a call's issue time, ("... 100 us, or 1.5 times the call's host issue time where ...").
_HOLD = re.compile(r"GPU held ([0-9.]+) us(?:, or ([0-9.]+) times the call's host issue time)?")


def _start_of_each_step(timer: str) -> str:
    """How each timed step starts under a ``timer`` whose hold does not grow with the step: on an idle GPU after
    the flush, or after the timer's fixed hold."""
    held = _HOLD.search(timer)
    if held is None:
        return "on an idle GPU after an L2 flush"
    return f"after an L2 flush and {held.group(1)} us of the GPU held, past which the host's time counts"


def _scorecard(
    cases: dict[tuple[str, str, str, str], dict[str, BenchRow]], found: Sequence[_Miss], targets: Targets
) -> list[str]:
    """A table at the top of the summary: per op and direction, of the cases where a target applies, how many
    kernelgate meets (the Targets missed section lists the others, with their causes)."""
    applies: dict[str, Callable[[str, BenchRow, dict[str, BenchRow]], bool]] = {
        "bandwidth": lambda direction, ours, by_impl: ours.regime == "bandwidth",
        "peer": lambda direction, ours, by_impl: _best_peer(by_impl) is not None,
        "eager": lambda direction, ours, by_impl: "eager" in by_impl,
        "host": lambda direction, ours, by_impl: (
            direction == FORWARD
            and ours.regime == "latency"
            and any(n.startswith("triton:") and not math.isnan(r.host_us) for n, r in by_impl.items())
        ),
    }
    missed = {(m.op, m.dtype, m.direction, m.shape, m.target) for m in found}
    counts: dict[tuple[str, str], dict[str, list[int]]] = {}
    for (op, dtype, direction, shape), by_impl in cases.items():
        ours = by_impl.get("kernelgate")
        if ours is None:
            continue
        row = counts.setdefault((op, direction), {t: [0, 0] for t in applies})
        for target, applies_here in applies.items():
            if applies_here(direction, ours, by_impl):
                row[target][1] += 1
                row[target][0] += (op, dtype, direction, shape, target) not in missed
    if not counts:
        return []
    lines = [
        "## Targets at a glance",
        "",
        "Cases where kernelgate meets each target, of those where the target applies (bandwidth: the bandwidth "
        "shapes; host cost: forward at latency shapes with a Triton kernel timed directly). The last section "
        "lists every miss with its cause.",
        "",
        f"| op | direction | bandwidth | >= {targets.versus_best_peer:.2f} of best peer | not slower than eager "
        "| host cost |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for (op, direction), row in counts.items():
        cells = [f"{met}/{of}" if of else "-" for met, of in row.values()]
        lines.append(f"| {op} | {direction} | " + " | ".join(cells) + " |")
    return [*lines, ""]


# How a forward+backward step ran, from its step path (_step_path), in the order of the summary's table.
STEP_WAYS = (
    "Function, faster back to back",
    "Function, by the device's time",
    "Function, kept untimed",
    "eager, timed",
    "eager, reference both ways",
    "not recorded",
)


def _step_way(step: _StepPath | None) -> str:
    """Which of :data:`STEP_WAYS` a forward+backward step took: the Function kept by the step route's timing of
    steps back to back, or by the device's time where eager autograd's step is mostly the device's; the Function
    kept without timing (mode triton, tuning off, a Backward that keeps it); eager autograd chosen by a timing, or
    where both passes run the reference; or a note without the step path (rows of an older bench)."""
    if step is None or step.path == "undecided":
        return STEP_WAYS[5]
    timed = step.detail.startswith("timed once")
    if step.path == "function":
        if not timed:
            return STEP_WAYS[2]
        return STEP_WAYS[1] if "the device's time decides" in step.detail else STEP_WAYS[0]
    return STEP_WAYS[3] if timed else STEP_WAYS[4]


def _step_ways(cases: dict[tuple[str, str, str, str], dict[str, BenchRow]]) -> list[str]:
    """A table: per op and regime, how kernelgate's forward+backward steps ran (:data:`STEP_WAYS`)."""
    counts: dict[tuple[str, str], dict[str, int]] = {}
    for (op, _dtype, direction, _shape), by_impl in cases.items():
        ours = by_impl.get("kernelgate")
        if direction != FORWARD_BACKWARD or ours is None:
            continue
        row = counts.setdefault((op, ours.regime), dict.fromkeys(STEP_WAYS, 0))
        row[_step_way(_step_path(ours.note))] += 1
    if all(row[STEP_WAYS[5]] == sum(row.values()) for row in counts.values()):
        return []  # no row names its step path (a bench before it did): nothing to count
    lines = [
        "## How the forward+backward steps ran",
        "",
        "kernelgate's step route per case (`Op.step_route`): its Function, kept by the timing of steps back to "
        "back, or by each step's device time where eager autograd's step keeps the device busy for most of its "
        "time back to back, or without timing (mode triton, tuning off, an op that keeps it); or eager autograd of "
        "the reference, chosen by that timing, or where both passes run the reference.",
        "",
        "| op | regime | " + " | ".join(STEP_WAYS) + " |",
        "| --- | --- |" + " ---: |" * len(STEP_WAYS),
    ]
    for (op, regime), row in counts.items():
        lines.append(f"| {op} | {regime} | " + " | ".join(str(n) for n in row.values()) + " |")
    return [*lines, ""]


def _miss_digest(found: Sequence[_Miss]) -> list[str]:
    """A table of the misses per op and direction: how many of each target, and the causes named."""
    if not found:
        return []
    counts: dict[tuple[str, str], dict[str, int]] = {}
    for m in found:
        row = counts.setdefault((m.op, m.direction), {})
        row[m.target] = row.get(m.target, 0) + 1
        if m.cause:
            row["cause:" + m.cause] = row.get("cause:" + m.cause, 0) + 1
    columns = (
        "bandwidth", "peer", "eager", "host",
        "cause:autograd", "cause:kernels", "cause:reference", "cause:timed", "cause:field", "cause:call",
        "cause:tuning",
    )  # fmt: skip
    lines = [
        "Misses per op and direction (a case can miss several targets). The last seven columns count the "
        "misses whose cause the run shows: the autograd step (the op's kernels called without autograd take at "
        "most half of the step, or reach the bandwidth target and are at least "
        f"{AUTOGRAD_GAP_RATIO - 1:.0%} faster than it), kernels that are themselves short of the target, the "
        "reference chosen "
        "(faster than the Triton kernels there, or eager autograd chosen for the step), whose call is eager's "
        "plus kernelgate's dispatch, a step timed faster through kernelgate's Function once but slower than "
        "eager when measured, no implementation measured at the case reaching the bandwidth target, or a "
        "forward whose chosen kernel, timed in its own row of the same case, was more than "
        f"{OWN_KERNEL_RATIO - 1:.0%} faster than kernelgate or reached the bandwidth target where kernelgate did "
        "not (the kernel is not the cause), or a forward whose "
        f"chosen kernel's own row was more than {TUNING_RATIO - 1:.0%} slower than another implementation's "
        "(tuning's decision is the cause).",
        "",
        "| op | direction | below bandwidth target | behind best peer | slower than eager | host cost | "
        "cause: autograd step | cause: kernels short | cause: reference + dispatch | cause: step timed faster | "
        "cause: none reaches it | cause: its kernel faster alone | cause: tuning's choice |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for (op, direction), row in counts.items():
        lines.append(f"| {op} | {direction} | " + " | ".join(str(row.get(c, 0)) for c in columns) + " |")
    return [*lines, ""]


# How much faster than kernelgate's forward+backward step its kernels called without autograd must be, where they
# are not short of the bandwidth target, for the summary to name the autograd step as the cause of a miss; and how
# much slower, where they are short, for it to describe the step's own kernels instead of theirs.
AUTOGRAD_GAP_RATIO = 1.05


def _autograd_gap(ours: BenchRow, by_impl: dict[str, BenchRow], floor: float) -> tuple[str, str]:
    """The cause of a forward+backward miss, as a kind and a clause: most of the step is not the op's
    kernels, or the kernels reach the bandwidth target ``floor`` and are at least :data:`AUTOGRAD_GAP_RATIO`
    times as fast as the step (``autograd``: the clause says how much the step adds), or the kernels
    themselves are short of ``floor`` (``kernels``); ``("", "")`` when the run shows none of these.

    A ``triton:<name>`` forward+backward row runs the forward launcher and the declared backward
    directly, without autograd. In the default suite at ef7f1f6, 36 misses named no cause: steps whose
    kernels alone took 0.52 to 0.90 of the step's time, more than half, while reaching the target
    (softmax float32 4096x8192: 206.4 us a step, its kernels 165.6 us, 0.95 of copy). A step short of the target
    yet faster than every such row ran other kernels than they launch (cross_entropy's forward with the gradient:
    bf16 4096x128256 at f2df623, 889 us a step, ``triton:looped`` 1064 us): the clause then reads the step's own row.
    """
    direct = [r for name, r in by_impl.items() if name.startswith("triton:")]
    if not direct:
        return "", ""
    best = min(direct, key=effective_us)
    kernels_us, step_us = effective_us(best), effective_us(ours)
    share = f", {best.frac_of_copy:.2f} of copy" if best.regime == "bandwidth" else ""
    if kernels_us <= step_us / 2:
        return "autograd", (
            f"; without autograd its kernels ({best.impl}) take {kernels_us:.1f} us{share}: "
            "most of the step is the autograd step (host time), not the kernels"
        )
    if best.regime == "bandwidth" and best.frac_of_copy < floor:
        if step_us * AUTOGRAD_GAP_RATIO <= kernels_us:
            # The step ran other kernels than the direct rows (cross_entropy's step forms its gradient in the forward
            # with the gradient, whose kernels no triton:* row launches): its own, not those, are short.
            chosen = _CHOSEN.match(ours.note)
            forward = chosen.group(1).split("[")[0] if chosen is not None else ""
            return "kernels", (
                f"; its step is faster than its kernels called without autograd ({best.impl}, "
                f"{best.frac_of_copy:.2f} of copy), so the kernels it ran, not the autograd step, are short of the "
                "target" + _reread_clause(ours, forward)
            )
        return "kernels", (
            f"; its kernels alone ({best.impl}, without autograd) reach {best.frac_of_copy:.2f} of copy: "
            "the kernels themselves are short of the target"
            + _reread_clause(best, best.impl.partition(":")[2])
            + _held_clause(best)
        )
    if kernels_us * AUTOGRAD_GAP_RATIO <= step_us:
        return "autograd", (
            f"; without autograd its kernels ({best.impl}) take {kernels_us:.1f} us{share}: the autograd step "
            f"adds {step_us - kernels_us:.1f} us to them (host time), the kernels are not short"
        )
    return "", ""


def _held_clause(row: BenchRow) -> str:
    """What a ``triton:*`` forward+backward row's kernels hold, as the run wrote it at the end of the row's note
    (``"; its kernel(s) ..."``, from :func:`kernelgate.bench.resources.describe`); else ``""``."""
    start = row.note.find("; its kernel")
    return row.note[start:] if start >= 0 else ""


def _reference_cause(ours: BenchRow, eager: BenchRow | None) -> tuple[str, str]:
    """The cause of a miss where kernelgate ran the reference (its tuning found the Triton candidates
    slower): the call is eager's plus kernelgate's dispatch, which at calls of a few microseconds is
    more than the 3 % the eager target allows. ``("", "")`` otherwise."""
    if eager is None or not ours.note.startswith(f"auto: reference ({Reason.REFERENCE_FASTER.value}"):
        return "", ""
    extra = effective_us(ours) - effective_us(eager)
    return "reference", (
        "; kernelgate ran the reference here (its Triton candidates were slower at this size), so the call is "
        f"eager's plus kernelgate's dispatch: {extra:+.1f} us"
    )


def _field_cause(by_impl: dict[str, BenchRow], floor: float) -> tuple[str, str]:
    """A bandwidth miss where no implementation measured at the case (eager, torch.compile, peers, each Triton
    kernel called directly, kernelgate) reaches the target ``floor``: ``("field", clause)`` naming the best; else
    ``("", "")``."""
    measured = [r for r in by_impl.values() if r.status == "ok" and not math.isnan(r.frac_of_copy)]
    if not measured:
        return "", ""
    best = max(measured, key=lambda r: r.frac_of_copy)
    if best.frac_of_copy >= floor:
        return "", ""
    if best.impl.startswith("triton:"):
        implementation = best.impl.partition(":")[2]
    else:
        chosen = _CHOSEN.match(best.note) if best.impl == "kernelgate" else None
        implementation = chosen.group(1).split("[")[0] if chosen is not None else ""
    return "field", (
        f"; no implementation measured here reaches the target: the best, {best.impl}, reaches "
        f"{best.frac_of_copy:.2f} of copy" + (_reread_clause(best, implementation) if implementation else "")
    )


# The kernels that formed a forward+backward row's gradient, as its note names them (runner.ran_note): their
# implementation ("; backward ran: split[...]", cross_entropy's "; forward with the gradient ran: looped[...]").
_GRADIENT_RAN = re.compile(r"; [a-z ]+ ran: ([A-Za-z_]\w*)")


def _reread_clause(row: BenchRow, forward_implementation: str) -> str:
    """Where ``row`` (kernelgate's kernels, forward ``forward_implementation``) streams rows twice, a clause with
    the bound that sets: its bytes over the formula's, at most what fraction of copy with every pass from memory,
    and how much of that it reaches (or that part of the second pass came from L2); else ``""``.

    A looped forward streams each row twice (where the op's does), and so does a backward that is not single-pass:
    the one the row's note says ran (``"; backward ran: split[...]"``; cross_entropy's gradient is formed by its
    forward with the gradient, ``"; forward with the gradient ran: looped[...]"``), or where the note does not say,
    one past a single block (the op's spec says how many bytes more: :class:`kernelgate.bench.specs.Rereads`). At
    bf16 512x131072 rms_norm's forward and backward move 8 row passes where the formula counts 5: at most 0.63 of
    copy; cross_entropy's looped forward with the gradient moves 3 passes of the logits where the formula counts 2.
    """
    from kernelgate.bench.specs import spec_for

    try:
        rereads = spec_for(row.op).rereads
    except KeyError:
        return ""
    dtype = DTYPES.get(row.dtype)
    if rereads is None or dtype is None or row.regime != "bandwidth" or row.bytes <= 0:
        return ""
    shape, size = tuple(int(d) for d in row.shape.split("x")), dtype.itemsize
    extra, parts = 0, []
    if rereads.forward is not None and forward_implementation.endswith("looped"):
        extra += rereads.forward.count(shape, size)
        parts.append(f"its {forward_implementation} forward, {rereads.forward.formula}")
    backward = _GRADIENT_RAN.search(row.note) if row.direction == FORWARD_BACKWARD else None
    if backward is not None and backward.group(1) not in (*rereads.single_pass, "reference"):
        extra += rereads.backward.count(shape, size)
        parts.append(f"its {backward.group(1)} {rereads.gradient}, {rereads.backward.formula}")
    elif (
        backward is None
        and row.direction == FORWARD_BACKWARD
        and rereads.one_block is not None
        and row.row_length > rereads.one_block
    ):
        extra += rereads.backward.count(shape, size)
        parts.append(f"its {rereads.gradient} past one block of {rereads.one_block}, {rereads.backward.formula}")
    if not extra:
        return ""
    bound = row.bytes / (row.bytes + extra)
    reach = (
        f"it reaches {row.frac_of_copy / bound:.2f} of that"
        if row.frac_of_copy <= bound
        else f"it reaches {row.frac_of_copy:.2f}, so part of the second pass came from L2"
    )
    return (
        f"; its kernels stream rows twice ({'; '.join(parts)}), {(row.bytes + extra) / row.bytes:.2f} times the "
        f"bytes the formula counts: at most {bound:.2f} of copy with every pass from memory, and {reach}"
    )


def _steady_state(ours: BenchRow, by_impl: dict[str, BenchRow]) -> str:
    """Forward+backward with steps issued back to back, where measured: ours and the best peer's."""
    mine = steady_fraction(ours)
    if math.isnan(mine):
        return ""
    peers = {
        p: steady_fraction(by_impl[p]) for p in PEERS if p in by_impl and not math.isnan(steady_fraction(by_impl[p]))
    }
    best = max(peers, key=peers.__getitem__) if peers else ""
    versus = f" (best peer {best} {peers[best]:.2f})" if best else ""
    return f"; with steps issued back to back, as in a training loop, it reaches {mine:.2f} of copy{versus}"


# --- summary ---------------------------------------------------------------------------------------


def _fmt(value: float, spec: str) -> str:
    return "-" if math.isnan(value) else format(value, spec)


def _order(entry: tuple[str, str, dict[str, BenchRow]]) -> tuple[str, int, int]:
    any_row = next(iter(entry[2].values()))
    return entry[0], any_row.row_length, any_row.rows


def _table_head(impls: Sequence[str], last: str) -> list[str]:
    return [
        "| shape | direction | " + " | ".join(impls) + f" | {last} |",
        "| --- | --- | " + " | ".join("---:" for _ in impls) + " | ---: |",
    ]


def _steady_table(entries: Sequence[tuple[str, str, dict[str, BenchRow]]], impls: Sequence[str]) -> list[str]:
    """Forward+backward at bandwidth shapes with steps issued back to back, where measured."""
    chosen = [e for e in entries if any(not math.isnan(steady_fraction(r)) for r in e[2].values())]
    if not chosen:
        return []
    lines = [
        "Forward+backward with steps issued back to back, then one synchronise (as in a training loop: "
        "the host issues the next step while the GPU runs, no L2 flush), fraction of copy bandwidth:",
        "",
        *_table_head(impls, "vs best peer"),
    ]
    for direction, shape, by_impl in sorted(chosen, key=_order):
        cells = [_fmt(steady_fraction(by_impl[i]), ".2f") if i in by_impl else "" for i in impls]
        ours = steady_fraction(by_impl["kernelgate"]) if "kernelgate" in by_impl else math.nan
        peers = [steady_fraction(by_impl[p]) for p in PEERS if p in by_impl]
        peers = [f for f in peers if not math.isnan(f)]
        ratio = f"{ours / max(peers):.2f}x" if peers and not math.isnan(ours) else ""
        lines.append(f"| {shape} | {direction} | " + " | ".join(cells) + f" | {ratio} |")
    return [*lines, ""]


def _first_calls(rows: Sequence[BenchRow]) -> list[str]:
    """Seconds of first calls per op and implementation: compiling and tuning, the run's fixed cost."""
    seconds: dict[str, dict[str, float]] = {}
    for r in rows:
        if not math.isnan(r.first_call_ms):
            by_impl = seconds.setdefault(r.op, {})
            name = "triton:*" if r.impl.startswith("triton:") else r.impl
            if r.impl == "kernelgate" and r.direction == FORWARD_BACKWARD:
                name = "kernelgate, forward+backward"
            by_impl[name] = by_impl.get(name, 0.0) + r.first_call_ms / 1e3
    if not seconds:
        return []
    names = _impl_order({n for by_impl in seconds.values() for n in by_impl})
    lines = [
        "## First calls",
        "",
        "Seconds spent in first calls, summed over the op's shapes, dtypes and directions: torch.compile "
        "compiling, kernelgate planning (tuning a new bucket; its forward+backward column is the backward's "
        "buckets), Triton compiling. This is most of a run's time beyond the measurements.",
        "",
        "| op | " + " | ".join(names) + " | total |",
        "| --- | " + " | ".join("---:" for _ in names) + " | ---: |",
    ]
    for op, by_impl in seconds.items():
        cells = [f"{by_impl[n]:.1f}" if n in by_impl else "" for n in names]
        lines.append(f"| {op} | " + " | ".join(cells) + f" | {sum(by_impl.values()):.1f} |")
    if len(seconds) > 1:  # the run's fixed cost per implementation, against its time budget
        totals = [sum(by_impl.get(n, 0.0) for by_impl in seconds.values()) for n in names]
        lines.append("| all ops | " + " | ".join(f"{t:.1f}" for t in totals) + f" | {sum(totals):.1f} |")
    return [*lines, ""]


RUNS_FILE = "runs.json"


def read_runs(folder: Path) -> list[dict[str, Any]]:
    """The measuring calls recorded in ``folder/runs.json`` (each: ``started``, ``seconds``, ``resumed``), or none."""
    try:
        runs = json.loads((folder / RUNS_FILE).read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(runs, list):
        return []
    return [r for r in runs if isinstance(r, dict) and isinstance(r.get("seconds"), int | float)]


def record_run(
    folder: Path, started: str, seconds: float, resumed: bool, before: Sequence[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """Record a measuring call in ``folder/runs.json``: after ``before``, the calls recorded before this one (by
    default those the file holds), where it resumes; alone where it does not. The CLI records its call after each
    op too, passing the calls it found at its start, so a call stopped from outside (a machine's time limit) still
    counts in the summary's run time."""
    runs = list(read_runs(folder) if before is None else before) if resumed else []
    runs.append({"started": started, "seconds": round(seconds, 3), "resumed": resumed})
    (folder / RUNS_FILE).write_text(json.dumps(runs, indent=1) + "\n")
    return runs


def _run_time(runs: Sequence[dict[str, Any]]) -> str:
    total = sum(float(r["seconds"]) for r in runs)
    if len(runs) == 1:
        return f"- run time: {total:.0f} s"
    parts = ", then ".join(f"{float(r['seconds']):.0f} s" for r in runs)
    return f"- run time: {total:.0f} s in {len(runs)} calls, each resuming the one before ({parts})"


def write_summary(
    rows: Sequence[BenchRow],
    path: Path,
    targets: Targets = TARGETS,
    runs: Sequence[dict[str, Any]] = (),
    kernel_notes: KernelNotes | None = None,
) -> Path:
    """Write a markdown summary: per op and dtype, fractions of copy bandwidth, latencies, missed targets;
    with ``runs`` (see :func:`read_runs`), how long the measuring took; with ``kernel_notes``, what the kernels
    behind forward bandwidth misses hold (:func:`kernelgate.bench.resources.kernel_notes`)."""
    lines = ["# kernelgate bench", ""]
    if rows:
        p = rows[0]
        liger = f"Liger-Kernel {p.liger_version}" if p.liger_version else "Liger-Kernel not installed"
        lines += [
            f"- device: {p.gpu} ({p.device}), driver {p.driver or '-'}; torch {p.torch_version}, triton "
            f"{p.triton_version or '-'}, {liger}",
            f"- kernelgate {p.kernelgate_version}, commit {p.kernelgate_commit}; started {p.started}",
            *([_run_time(runs)] if runs else []),
            f"- timer: {p.timer}",
            f"- copy bandwidth measured in the same run: {p.copy_gbps:.0f} GB/s (bytes read + written)",
            "",
            "Cells are fractions of the copy bandwidth (achieved GB/s over minimal bytes, formulas in the CSV's "
            "`byte_formula`). *vs best peer* is the best time of eager, compile and liger over kernelgate's "
            f"(above 1: kernelgate is faster). Latency shapes (inputs under {LATENCY_BYTES // 2**20} MiB) show "
            "microseconds per call: "
            "the larger of the device time and the host cost.",
            "",
        ]
    cases = _cases(rows)
    found = _find_misses(rows, targets, kernel_notes)
    lines += _scorecard(cases, found, targets)
    lines += _step_ways(cases)
    groups: dict[tuple[str, str], list[tuple[str, str, dict[str, BenchRow]]]] = {}
    for (op, dtype, direction, shape), by_impl in cases.items():
        groups.setdefault((op, dtype), []).append((direction, shape, by_impl))
    for (op, dtype), entries in groups.items():
        lines += [f"## {op} {dtype}", ""]
        formulas = {d: next(iter(b.values())).byte_formula for d, _, b in entries}
        lines += [f"- bytes, {d}: `{f}`" for d, f in formulas.items()] + [""]
        impls = _impl_order(i for _, _, b in entries for i in b)
        for regime in ("bandwidth", "latency"):
            selected = [e for e in entries if next(iter(e[2].values())).regime == regime]
            if not selected:
                continue
            if regime == "bandwidth":
                lines.append("Fraction of copy bandwidth at bandwidth shapes:")
            else:
                lines.append("Microseconds per call at latency shapes (the larger of device time and host cost):")
            lines.append("")
            lines += _table_head(impls, "vs best peer")
            for direction, shape, by_impl in sorted(selected, key=_order):
                cells = []
                for impl in impls:
                    r = by_impl.get(impl)
                    if r is None:
                        cells.append("")
                    elif regime == "bandwidth":
                        cells.append(_fmt(r.frac_of_copy, ".2f"))
                    else:
                        cells.append(_fmt(effective_us(r), ".1f"))
                ours, peer = by_impl.get("kernelgate"), _best_peer(by_impl)
                ratio = f"{effective_us(peer) / effective_us(ours):.2f}x" if ours and peer else ""
                lines.append(f"| {shape} | {direction} | " + " | ".join(cells) + f" | {ratio} |")
            lines.append("")
            if regime == "bandwidth":
                lines += _steady_table(selected, impls)
    lines += _first_calls(rows)
    missed = [m.text for m in found]
    lines += [
        "## Targets missed",
        "",
        f"Targets: forward >= {targets.forward_fraction:.2f} and forward+backward >= "
        f"{targets.forward_backward_fraction:.2f} of copy bandwidth at bandwidth shapes; kernelgate >= "
        f"{targets.versus_best_peer:.2f}x the speed of the best peer and never slower than eager by more than "
        f"{targets.versus_eager - 1:.0%} at every shape; host cost within {targets.host_over_triton_us:g} us of a "
        f"direct Triton launch at latency shapes.",
        "",
    ]
    lines += [*_miss_digest(found), *(f"- {m}" for m in missed)] if missed else ["None."]
    problems = [r for r in rows if r.status != "ok"]
    if problems:
        lines += ["", "## Not measured", ""]
        lines += [f"- {r.op} {r.dtype} {r.shape} {r.direction} {r.impl}: {r.status}: {r.note}" for r in problems]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


# --- plots -----------------------------------------------------------------------------------------


def plots_available() -> bool:
    """Whether matplotlib can be imported (``pip install 'kernelgate[bench]'``)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def write_plots(rows: Sequence[BenchRow], out: Path, targets: Targets = TARGETS) -> list[Path]:
    """One PNG per op: fraction of copy bandwidth against row length (log2), a line per implementation.

    Only bandwidth-regime rows are drawn; one panel per (direction, dtype). Needs matplotlib.
    """
    from matplotlib.figure import Figure  # a Figure without pyplot: no global backend state

    out.mkdir(parents=True, exist_ok=True)
    written = []
    by_op: dict[str, list[BenchRow]] = {}
    for r in _ok(rows):
        if r.regime == "bandwidth":
            by_op.setdefault(r.op, []).append(r)
    for op, op_rows in by_op.items():
        dtypes = list(dict.fromkeys(r.dtype for r in op_rows))
        directions = [d for d in (FORWARD, FORWARD_BACKWARD) if any(r.direction == d for r in op_rows)]
        fig = Figure(figsize=(5.5 * len(dtypes), 4 * len(directions)), layout="constrained")
        axes = fig.subplots(len(directions), len(dtypes), squeeze=False)
        for i, direction in enumerate(directions):
            for j, dtype in enumerate(dtypes):
                ax = axes[i][j]
                panel = [r for r in op_rows if r.direction == direction and r.dtype == dtype]
                for impl in _impl_order(r.impl for r in panel):
                    points: dict[int, list[float]] = {}
                    for r in panel:
                        if r.impl == impl:
                            points.setdefault(r.row_length, []).append(r.frac_of_copy)
                    xs = sorted(points)
                    ax.plot(xs, [statistics.median(points[x]) for x in xs], marker="o", label=impl)
                floor = targets.forward_fraction if direction == FORWARD else targets.forward_backward_fraction
                ax.axhline(floor, color="gray", linestyle="--", linewidth=1)
                ax.set_xscale("log", base=2)
                ax.set_ylim(bottom=0)
                ax.set_title(f"{op} {dtype} {direction}")
                ax.set_xlabel("row length")
                ax.set_ylabel("fraction of copy bandwidth")
                ax.grid(True, alpha=0.3)
                ax.legend(fontsize="small")
        path = out / f"{op}.png"
        fig.savefig(path, dpi=100)
        written.append(path)
    return written


# --- console ---------------------------------------------------------------------------------------


def print_table(console: Console, rows: Sequence[BenchRow], title: str) -> None:
    """A table of ``rows`` (one op and dtype): per shape and direction, each implementation's result."""
    cases = _cases(rows)
    impls = _impl_order(i for by_impl in cases.values() for i in by_impl)
    table = Table(title=title)
    for column in ("shape", "direction", *impls):
        table.add_column(column, justify="left" if column in ("shape", "direction") else "right")
    for (_, _, direction, shape), by_impl in cases.items():
        cells = []
        for impl in impls:
            r = by_impl.get(impl)
            if r is None:
                cells.append("")
            elif r.regime == "bandwidth":
                cells.append(f"{r.frac_of_copy:.2f} {r.time_us:.0f}us")
            else:
                cells.append(f"{effective_us(r):.1f}us")
        table.add_row(shape, direction, *cells)
    console.print(table)
    for r in rows:
        if r.status != "ok":
            console.print(f"  {r.shape} {r.direction} {r.impl}: [yellow]{r.status}[/yellow]: {r.note}")
