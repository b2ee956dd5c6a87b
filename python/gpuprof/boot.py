"""``gpuprof.boot``, also ``python -m gpuprof.boot`` (prints the folder): the public
path of :mod:`gpuprof.cli.boot`."""

import sys

from .cli import boot as _impl
from .cli.boot import *  # noqa: F403 - for type checkers

if __name__ == "__main__":
    print(_impl.BOOT_DIR)
else:
    sys.modules[__name__] = _impl
