"""python -m gpuprof: see gpuprof.cli."""

import sys

from .cli import main

sys.exit(main())
