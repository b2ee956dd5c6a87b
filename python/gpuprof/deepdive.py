"""``gpuprof.deepdive``: the public path of :mod:`gpuprof.api.deepdive`."""

import sys

from .api import deepdive as _impl
from .api.deepdive import *  # noqa: F403 - for type checkers

sys.modules[__name__] = _impl
