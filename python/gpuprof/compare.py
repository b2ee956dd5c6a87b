"""``gpuprof.compare``: the public path of :mod:`gpuprof.api.compare`."""

import sys

from .api import compare as _impl
from .api.compare import *  # noqa: F403 - for type checkers

sys.modules[__name__] = _impl
