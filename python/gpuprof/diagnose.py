"""``gpuprof.diagnose``: the public path of :mod:`gpuprof.analysis.diagnose`."""

import sys

from .analysis import diagnose as _impl
from .analysis.diagnose import *  # noqa: F403 - for type checkers

sys.modules[__name__] = _impl
