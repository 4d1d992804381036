"""Checks shared by the tests of the benchmark scripts that time variants of kernels (benchmarks/*_variants.py,
*_split_looped.py, *_persistent.py), each built on benchmarks/variant_timing.py."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from kernelgate.op import TritonImpl


def check_a_wrong_variant_is_reported(
    script: ModuleType,
    variant: TritonImpl,
    perturb: Callable[[Any], Any],
    args: Sequence[str],
    out: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``variant`` with its result passed through ``perturb`` (1 % off, say), as the script's only variant, fails the
    reference check: run with ``args`` (its ``--out`` is ``out``), the script returns 1 and records a mismatch for
    every configuration."""

    def wrong_launcher(*values: object, config: object) -> object:
        return perturb(variant.launcher(*values, config=config))

    wrong = dataclasses.replace(variant, name="wrong", launcher=wrong_launcher)
    monkeypatch.setattr(script, "variants", lambda *ignored: [wrong])
    assert script.main([*args, "--out", str(out)]) == 1
    results = json.loads(out.read_text())["cases"][0]["results"]
    assert results and all(r["matches_reference"] is False and "mismatch" in r for r in results)
