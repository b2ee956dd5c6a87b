"""``gpuprof.distributed``: the public path of :mod:`gpuprof.analysis.distributed`."""

import sys

from .analysis import distributed as _impl
from .analysis.distributed import *  # noqa: F403 - for type checkers

sys.modules[__name__] = _impl
