"""``gpuprof.views``: the public path of :mod:`gpuprof.results.views`."""

import sys

from .results import views as _impl
from .results.views import *  # noqa: F403 - for type checkers

sys.modules[__name__] = _impl
