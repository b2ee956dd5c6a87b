"""``gpuprof.memory``: the public path of :mod:`gpuprof.analysis.memory`."""

import sys

from .analysis import memory as _impl
from .analysis.memory import *  # noqa: F403 - for type checkers

sys.modules[__name__] = _impl
