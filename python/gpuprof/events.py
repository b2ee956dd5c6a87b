"""``gpuprof.events``: the public path of :mod:`gpuprof.results.events`."""

import sys

from .results import events as _impl
from .results.events import *  # noqa: F403 - for type checkers

sys.modules[__name__] = _impl
