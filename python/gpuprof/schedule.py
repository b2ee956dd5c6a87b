"""``gpuprof.schedule``: the public path of :mod:`gpuprof.record.schedule`."""

import sys

from .record import schedule as _impl
from .record.schedule import *  # noqa: F403 - for type checkers

sys.modules[__name__] = _impl
