"""benchmarks/cross_entropy_persistent.py: cross_entropy_with_grad's looped kernel on a persistent grid."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from variant_scripts import check_a_wrong_variant_is_reported


@pytest.fixture
def persistent_script(benchmark_script: Callable[[str], ModuleType]) -> ModuleType:
    pytest.importorskip("triton")
    return benchmark_script("cross_entropy_persistent")


def test_every_variant_matches_the_reference_interpreted(persistent_script: ModuleType, tmp_path: Path) -> None:
    """Interpreted, at 5 rows of 2500 classes (in blocks of 1024 or 2048, the last masked), the package's looped
    implementation and the persistent variant match the reference at every configuration that suits the row. The
    variant runs every PER_SM of its space: on the interpreter's 2 multiprocessors PER_SM 1 and 2 launch 2 and 4
    programs, so programs take several rows in turn."""
    out = tmp_path / "persistent.json"
    args = ["--interpret", "--shapes", "5x2500", "--dtype", "float32", "--out", str(out)]
    assert persistent_script.main(args) == 0
    result = json.loads(out.read_text())
    [case] = result["cases"]
    assert case["shape"] == [5, 2500] and result["copy_gbps"] is None and "kernelgate_commit" in result
    by_variant: dict[str, list[dict[str, int]]] = {}
    for r in case["results"]:
        assert r["matches_reference"] is True and "time_us" not in r, r
        by_variant.setdefault(r["variant"], []).append(r["config"])
    assert set(by_variant) == {"looped", "persistent_looped"}
    assert {c["PER_SM"] for c in by_variant["persistent_looped"]} == {1, 2, 4}
    looped = {tuple(sorted(c.items())) for c in by_variant["looped"]}
    persistent = {tuple(sorted((k, v) for k, v in c.items() if k != "PER_SM")) for c in by_variant["persistent_looped"]}
    assert persistent <= looped


def test_a_wrong_variant_is_reported(
    persistent_script: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A variant whose gradient is off by 1 % fails the check: the script returns 1 and records the mismatch."""
    args = ["--interpret", "--shapes", "3x2100", "--dtype", "float32"]
    check_a_wrong_variant_is_reported(
        persistent_script, persistent_script.variants()[-1], lambda r: (r[0], r[1] * 1.01), args,
        tmp_path / "persistent.json", monkeypatch,
    )  # fmt: skip


def test_a_malformed_shape_is_refused_with_the_form_expected(
    persistent_script: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--shapes`` takes ROWSxLENGTH: anything else stops the script with argparse's error naming the form and what
    came, before anything runs."""
    with pytest.raises(SystemExit) as exit_info:
        persistent_script.main(["--interpret", "--shapes", "8192by32000", "--out", str(tmp_path / "x.json")])
    assert exit_info.value.code == 2
    assert "a shape is ROWSxLENGTH, such as 8192x32000; got '8192by32000'" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()
