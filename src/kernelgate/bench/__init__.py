"""``kernelgate bench``: eager PyTorch, torch.compile, kernelgate, its Triton kernels and Liger-Kernel side by side.

>>> import kernelgate.bench
>>> spec = kernelgate.bench.spec_for("rms_norm"); spec.family, spec.dims
('rowwise', ('M', 'N'))

:func:`run` measures and returns :class:`BenchRow` rows; :func:`write_csv`, :func:`write_summary` and
:func:`write_plots` turn them into files (``docs/bench.md`` explains each column). The suite of
shapes is ``shapes.json`` beside this module, or a file of the same form.
"""

from __future__ import annotations

from kernelgate.bench.report import (
    COLUMNS,
    SCHEMA_VERSION,
    TARGETS,
    BenchRow,
    Provenance,
    Targets,
    effective_us,
    miss_breakdown,
    misses,
    plots_available,
    print_table,
    read_csv,
    read_runs,
    record_run,
    steady_fraction,
    write_csv,
    write_plots,
    write_summary,
)
from kernelgate.bench.runner import TIME_LIMIT_NOTE, resolve_ops, run
from kernelgate.bench.specs import SPECS, BenchSpec, Bytes, bench_specs, spec_for
from kernelgate.bench.suite import (
    DEFAULT_SUITE_PATH,
    DTYPES,
    BenchError,
    Case,
    ShapeGroup,
    Suite,
    default_suite,
    load_suite,
)

__all__ = [
    "COLUMNS",
    "DEFAULT_SUITE_PATH",
    "DTYPES",
    "SCHEMA_VERSION",
    "SPECS",
    "TARGETS",
    "TIME_LIMIT_NOTE",
    "BenchError",
    "BenchRow",
    "BenchSpec",
    "Bytes",
    "Case",
    "Provenance",
    "ShapeGroup",
    "Suite",
    "Targets",
    "bench_specs",
    "default_suite",
    "effective_us",
    "load_suite",
    "miss_breakdown",
    "misses",
    "plots_available",
    "print_table",
    "read_csv",
    "read_runs",
    "record_run",
    "resolve_ops",
    "run",
    "spec_for",
    "steady_fraction",
    "write_csv",
    "write_plots",
    "write_summary",
]
