"""top_loop.py in a process whose first sample is slow to set up, as on a loaded
machine where the first capture's imports (and CUPTI, on a GPU) take seconds:

    python top_slow_start.py STOP_FILE SECONDS

The on-demand thread sleeps SECONDS before it makes the first capture's profile, and
answers nothing meanwhile. Steps are top_loop.crunch() (``--step-fn top_loop:crunch``).
"""

import sys
import time

import top_loop
from gpuprof.api.ondemand._armed import OnDemand

_prepare = OnDemand._prepare
_slow = [float(sys.argv[2])]


def _slow_prepare(self, cap):
    if _slow:
        time.sleep(_slow.pop())
    _prepare(self, cap)


OnDemand._prepare = _slow_prepare

if __name__ == "__main__":
    top_loop.main(sys.argv[1], 20_000, 0.0)
