"""benchmarks/tuning_repeatability.py: one bucket tuned several times from an empty cache, then its candidates timed
head to head."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest


@pytest.fixture
def repeatability_script(benchmark_script: Callable[[str], ModuleType]) -> ModuleType:
    pytest.importorskip("triton")
    return benchmark_script("tuning_repeatability")


def test_each_round_tunes_afresh_and_every_candidate_timed_in_full_is_timed_again(
    repeatability_script: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Interpreted, rms_norm at 2x2500 tuned twice from empty caches: each round records the tuner's time of the
    candidates it timed in full and what it chose; each of those candidates is then timed again directly, and a
    line a candidate shows both."""
    out = tmp_path / "repeatability.json"
    args = ["--op", "rms_norm", "--shape", "2x2500", "--dtype", "float32", "--rounds", "2", "--idle-s", "0"]
    assert repeatability_script.main([*args, "--direct-rounds", "1", "--interpret", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert (result["op"], result["shape"], result["dtype"]) == ("rms_norm", [2, 2500], "float32")
    assert len(result["rounds"]) == 2 and "kernelgate_commit" in result
    labels = set()
    for r in result["rounds"]:
        assert r["tuned_us"] and all(t > 0 for t in r["tuned_us"].values()), r
        assert r["sm_clock_mhz"] is None and isinstance(r["chosen"], str)
        labels |= set(r["tuned_us"])
    assert set(result["direct_us"]) == labels
    assert all(len(times) == 1 and times[0] > 0 for times in result["direct_us"].values())
    printed = capsys.readouterr().out
    assert all(label in printed for label in labels) and printed.count("chosen:") == 1


def test_rounds_below_one_are_refused_naming_what_came(
    repeatability_script: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--rounds 0`` stops the script before anything runs, with argparse's error naming the flags and the values."""
    with pytest.raises(SystemExit) as exit_info:
        repeatability_script.main(
            ["--op", "rms_norm", "--shape", "2x2500", "--rounds", "0", "--interpret", "--out", str(tmp_path / "x.json")]
        )
    assert exit_info.value.code == 2
    assert "--rounds and --direct-rounds take 1 or more; got 0 and 3" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()
