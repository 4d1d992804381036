"""Provenance and output of the benchmark scripts beside this file (imported as a sibling module).

Every result names the device, the versions, the kernelgate commit (``KERNELGATE_COMMIT``, else
``git rev-parse``) and the date, and is written as indented JSON.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from kernelgate import backend


def commit() -> str:
    """The kernelgate commit measured: ``KERNELGATE_COMMIT``, else the checkout's short hash, else "unknown"."""
    if os.environ.get("KERNELGATE_COMMIT"):
        return os.environ["KERNELGATE_COMMIT"]
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def provenance(device: torch.device) -> dict[str, Any]:
    """Device, torch, Triton and Python versions, kernelgate commit and the date (UTC)."""
    return {
        "device": backend.device_name(device),
        "torch": torch.__version__,
        "triton": backend.triton_version(),
        "python": platform.python_version(),
        "kernelgate_commit": commit(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def write_json(path: Path, result: dict[str, Any]) -> None:
    """Write ``result`` to ``path`` (its folder created) as indented JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
