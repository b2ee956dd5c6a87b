"""``gpuprof.demo``, also ``python -m gpuprof.demo``: the public path of
:mod:`gpuprof.cli.demo` (the bundled training loop, profiled)."""

import sys

from .cli import demo as _impl
from .cli.demo import *  # noqa: F403 - for type checkers

if __name__ == "__main__":
    sys.exit(_impl.main())
else:
    sys.modules[__name__] = _impl
