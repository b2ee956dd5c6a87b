"""Before/after comparison of two profiles: ``gpuprof.compare(before, after)``.

Either side may be a running-or-finished ``gpuprof.profile``, a loaded
profile (``gpuprof.load``), a :class:`gpuprof.Results`, or the path of a
saved ``.gpuprof`` file. Times are compared per recorded step, so profiles
with different step counts compare fairly. The figures are computed in
gpuprof.analysis.comparison; this module opens saved files and writes the page.
"""

from __future__ import annotations

import os

from ..analysis import comparison as _comparison
from ..analysis.comparison import Delta
from ..results._results import Results
from ._accessors import ResultAccessors
from ._loaded import load

# what compare() takes on either side
Profile = ResultAccessors | Results | str

__all__ = ["Comparison", "Delta", "compare"]


class Comparison(_comparison.Comparison):
    """What changed between two profiles (per-step figures)."""

    def export_html(self, path: str | os.PathLike[str], *, title: str | None = None) -> str:
        """Write this comparison as one self-contained HTML page (docs/report.md):
        step time and where it goes on each side, the op and kernel changes as
        sortable tables, and the findings gone, new and kept. Returns ``path``."""
        from ..exporters.html import export_compare_html

        return export_compare_html(self, path, title=title)


def compare(before: Profile, after: Profile, limit: int = 15) -> Comparison:
    """Compare two profiles; ``print()`` the result for a report.

    Args:
        before, after: profiles, loaded profiles, Results or saved .gpuprof paths.
        limit: rows per table (largest absolute changes first).
    """
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"compare(): limit must be a positive int, got {limit!r}")
    before = load(before) if isinstance(before, str) else before
    after = load(after) if isinstance(after, str) else after
    return _comparison.build(before, after, limit, Comparison)
