"""``gpuprof.occupancy``: the public path of :mod:`gpuprof.results.occupancy`."""

import sys

from .results import occupancy as _impl
from .results.occupancy import *  # noqa: F403 - for type checkers

sys.modules[__name__] = _impl
