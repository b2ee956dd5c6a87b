"""python -m gpuprof.cli: the same as python -m gpuprof."""

import sys

from . import main

sys.exit(main())
