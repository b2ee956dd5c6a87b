"""``gpuprof.processes``: the public path of :mod:`gpuprof.analysis.processes`."""

import sys

from .analysis import processes as _impl
from .analysis.processes import *  # noqa: F403 - for type checkers

sys.modules[__name__] = _impl
