"""The documentation's code runs as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _python_blocks(path: Path) -> str:
    return "\n".join(re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S))


def _fresh_env(cache_dir: Path) -> dict[str, str]:
    """The environment without KERNELGATE_* settings, with an empty decision cache (never the user's)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELGATE_")}
    return {**env, "KERNELGATE_CACHE_DIR": str(cache_dir)}


@pytest.mark.parametrize("page", ["docs/first-op.md", "README.md"])
def test_page_code_runs(page: str, tmp_path: Path) -> None:
    """Every python block of the page, run in order in a fresh process, finishes without error."""
    code = _python_blocks(ROOT / page)
    assert code.strip(), f"{page} has no python code block"
    script = tmp_path / "page.py"  # Triton needs the kernels' source in a real file
    script.write_text(code)
    result = subprocess.run(
        # faulthandler: a process killed by a signal (an abort at exit was seen once on the H200) prints
        # every thread's Python stack, so the failure says where.
        [sys.executable, "-X", "faulthandler", str(script)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=_fresh_env(tmp_path),
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]


def test_first_op_page_prints_what_it_says(tmp_path: Path) -> None:
    """The first-op page's comments match what its code prints (plan, fallback record, error text)."""
    code = _python_blocks(ROOT / "docs/first-op.md")
    script = ROOT / "docs" / "_first_op_check.py"
    try:
        script.write_text(code)
        out = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, env=_fresh_env(tmp_path), timeout=600
        ).stdout
    finally:
        script.unlink(missing_ok=True)
    assert "implementation='flat', reason='tuned')" in out
    assert "reason='dtype-unsupported', count=1" in out
    assert "relu_squared(): argument 'x' must have dtype float16, bfloat16, float32 or float64; got int64." in out


def _stated_defaults(text: str, row: str) -> dict[str, str]:
    """The variables whose default a settings table states as a literal value, with that value."""
    return dict(re.findall(row, text, flags=re.M))


@pytest.mark.parametrize(
    ("page", "row"),
    [
        ("README.md", r"^\| `(KERNELGATE_\w+)` \|.*\| `([^`]+)` \|$"),
        ("src/kernelgate/settings.py", r"^``(KERNELGATE_\w+)``.*``([^`]+)``$"),
    ],
)
def test_a_settings_table_states_the_defaults_the_code_has(page: str, row: str) -> None:
    """Each variable a settings table gives a literal default for, set to that value, reads as it does unset (the
    module's table said 0.05 for KERNELGATE_TUNE_MARGIN where the code and the README had 0.02)."""
    from kernelgate.settings import Settings

    stated = _stated_defaults((ROOT / page).read_text(), row)
    assert {"KERNELGATE_MODE", "KERNELGATE_TUNE", "KERNELGATE_TUNE_MARGIN", "KERNELGATE_FAST_LAUNCH"} <= set(stated)
    unset = Settings.from_env({})
    for variable, value in stated.items():
        assert Settings.from_env({variable: value}) == unset, f"{page}: {variable} is documented as {value!r}"
