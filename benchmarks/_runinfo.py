"""What every benchmark result records about its run: when, how, and which commit."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

__all__ = ["git", "run_info"]


def git(*args) -> str | None:
    """Output of a git command in the repository, or None when git cannot answer."""
    try:
        proc = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10)
        return proc.stdout.strip() if proc.returncode == 0 else None
    except Exception:  # noqa: BLE001
        return None


def run_info(benchmark: str) -> dict:
    """The benchmark's name, UTC time, command line and git commit (dirty or not)."""
    status = git("status", "--porcelain")
    return {
        "benchmark": benchmark,
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "git": {
            "commit": git("rev-parse", "HEAD"),
            "dirty": None if status is None else bool(status),
        },
    }
