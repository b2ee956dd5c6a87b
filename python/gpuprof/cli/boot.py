"""The folder that makes ``GPUPROF_ON_DEMAND=1`` arm programs gpuprof does not start.

    export GPUPROF_ON_DEMAND=1 PYTHONPATH="$(python -m gpuprof.boot)${PYTHONPATH:+:$PYTHONPATH}"

``python -m gpuprof.boot`` prints it; its ``sitecustomize`` imports gpuprof at the
start of every Python program that has it on ``PYTHONPATH`` (docs/on-demand.md).
"""

from __future__ import annotations

import os

__all__ = ["BOOT_DIR"]

BOOT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "boot_site")

if __name__ == "__main__":
    print(BOOT_DIR)
