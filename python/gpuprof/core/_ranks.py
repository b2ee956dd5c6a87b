"""Who this process is in a distributed run: rank, local rank and world size
(``torch.distributed`` when a process group is initialised, else torchrun's
variables), the trace's ``distributedInfo``, and ``{rank}`` placeholders in output
names. Below every layer that names a file or writes a trace header; torch is
never imported, only looked up in ``sys.modules``. See docs/distributed.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from typing import Any

__all__ = ["distributed_info", "expand_name", "rank_info"]

# ---- who am I ---------------------------------------------------------------------------------


def _env_int(name: str) -> int | None:
    v = os.environ.get(name)
    if v is None or v.strip() == "":
        return None
    try:
        return int(v)
    except ValueError:
        raise ValueError(
            f"gpuprof: environment variable {name}={v!r} is not an integer; "
            f"set it to the process's {name.lower()} (torchrun does) or unset it"
        ) from None


def _torch_dist():
    """torch.distributed when the program imported it and initialised a process
    group, else None. Never imports torch."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return dist
    except Exception:  # a half-initialised process group must not break profiling
        pass
    return None


def rank_info() -> dict:
    """This process's place in a distributed job.

    Returns:
        ``{"rank": int, "local_rank": int, "world_size": int}``. From
        ``torch.distributed`` when a process group is initialised (the local
        rank then still comes from ``LOCAL_RANK``), else from the ``RANK``,
        ``LOCAL_RANK`` and ``WORLD_SIZE`` variables torchrun sets, else rank 0
        of 1. Without ``LOCAL_RANK`` the local rank equals the rank (one node).

    Raises:
        ValueError: one of the variables is not an integer, only one of
            ``RANK``/``WORLD_SIZE`` is set, or the rank is outside the world.
    """
    rank = world = None
    dist = _torch_dist()
    if dist is not None:
        try:
            rank, world = int(dist.get_rank()), int(dist.get_world_size())
        except Exception:
            rank = world = None
    if rank is None:
        rank, world = _env_int("RANK"), _env_int("WORLD_SIZE")
        if (rank is None) != (world is None):
            have, missing = ("RANK", "WORLD_SIZE") if world is None else ("WORLD_SIZE", "RANK")
            raise ValueError(
                f"gpuprof: {have} is set but {missing} is not; set both (torchrun does) or neither"
            )
        if rank is None:
            rank, world = 0, 1
    if world < 1 or not 0 <= rank < world:
        raise ValueError(
            f"gpuprof: rank {rank} is not inside a world of size {world}; check RANK and WORLD_SIZE"
        )
    local = _env_int("LOCAL_RANK")
    if local is None:
        local = rank
    if local < 0:
        raise ValueError(
            f"gpuprof: LOCAL_RANK={local} is negative; it must be the process's index on its node"
        )
    return {"rank": rank, "local_rank": local, "world_size": world}


def _nccl_version() -> str | None:
    torch = sys.modules.get("torch")
    nccl = getattr(getattr(torch, "cuda", None), "nccl", None) or sys.modules.get("torch.cuda.nccl")
    if nccl is None:
        return None
    try:
        v = nccl.version()
    except Exception:  # built without NCCL, or no driver
        return None
    if isinstance(v, (tuple, list)):
        return ".".join(str(int(x)) for x in v)
    return str(v)


def _jsonable(value):
    """``value`` as plain JSON data (torch's pg config may hold odd types)."""
    try:
        return json.loads(json.dumps(value, default=str))
    except (TypeError, ValueError):
        return str(value)


def distributed_info() -> dict:
    """The trace's ``distributedInfo`` object (trace-format section 9).

    With an initialised ``torch.distributed`` process group: ``backend``,
    ``rank``, ``world_size``, and where this torch provides them ``pg_count``,
    ``pg_config`` and ``nccl_version`` (NCCL backends). Otherwise ``rank`` and
    ``world_size`` from :func:`rank_info`: ``{"rank": 0, "world_size": 1}`` for
    a single process, so that HTA needs no manual editing.

    Raises:
        ValueError: as :func:`rank_info`.
    """
    dist = _torch_dist()
    if dist is not None:
        try:
            info: dict[str, Any] = {
                "backend": str(dist.get_backend()),
                "rank": int(dist.get_rank()),
                "world_size": int(dist.get_world_size()),
            }
        except Exception:
            info = None
        if info is not None:
            with contextlib.suppress(Exception):
                info["pg_count"] = int(dist.get_pg_count())
            c10d = getattr(dist, "distributed_c10d", None)
            get_configs = getattr(c10d, "_get_all_pg_configs", None)
            if get_configs is not None:
                with contextlib.suppress(Exception):
                    info["pg_config"] = _jsonable(get_configs())
            if "nccl" in info["backend"]:
                v = _nccl_version()
                if v:
                    info["nccl_version"] = v
            return info
    r = rank_info()
    return {"rank": r["rank"], "world_size": r["world_size"]}


_PLACEHOLDER = re.compile(r"\{(rank|local_rank|world_size)\}")


def expand_name(name):
    """Replace ``{rank}``, ``{local_rank}`` and ``{world_size}`` in an output name.

    Other braces are left alone, so a name without these placeholders comes
    back unchanged. Example: ``expand_name("traces/rank{rank}.json")`` is
    ``"traces/rank1.json"`` on rank 1.

    Args:
        name: a str or os.PathLike.

    Returns:
        The expanded name (str; os.PathLike input is converted).

    Raises:
        TypeError: ``name`` is not a str or os.PathLike.
        ValueError: as :func:`rank_info`, when a placeholder needs the rank.
    """
    if isinstance(name, os.PathLike):
        name = os.fspath(name)
    if isinstance(name, bytes):
        name = os.fsdecode(name)
    if not isinstance(name, str):
        raise TypeError(f"expand_name(): name must be a str or os.PathLike, got {name!r}")
    if not _PLACEHOLDER.search(name):
        return name
    info = rank_info()
    return _PLACEHOLDER.sub(lambda m: str(info[m.group(1)]), name)
