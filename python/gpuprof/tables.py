"""``gpuprof.tables``: the public path of :mod:`gpuprof.results.tables`."""

import sys

from .results import tables as _impl
from .results.tables import *  # noqa: F403 - for type checkers

sys.modules[__name__] = _impl
