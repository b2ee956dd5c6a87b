"""``gpuprof.profiler``: the public path of :mod:`gpuprof.api.profiler`."""

import sys

from .api import profiler as _impl
from .api.profiler import *  # noqa: F403 - for type checkers

sys.modules[__name__] = _impl
