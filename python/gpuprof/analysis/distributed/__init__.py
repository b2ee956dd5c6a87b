"""Distributed training: rank awareness, communication overlap, merged multi-rank traces.

Every rank profiles itself and writes its own trace (one file per rank, with
``distributedInfo`` so that HTA and TensorBoard find the rank). This module

- tells who this process is: :func:`rank_info` (rank, local rank, world size
  from ``torch.distributed`` when a process group is initialised, else from
  torchrun's ``RANK``/``LOCAL_RANK``/``WORLD_SIZE``) and :func:`distributed_info`
  (the ``distributedInfo`` object of the trace);
- expands ``{rank}``, ``{local_rank}`` and ``{world_size}`` in output names
  (:func:`expand_name`);
- splits each step's GPU time into compute, communication (NCCL kernels),
  their overlap and the communication left exposed (:func:`comm_overlap`);
- merges the per-rank traces into one timeline with one process per rank and
  a cross-rank table that names the slowest rank of every step
  (:func:`merge`, ``python -m gpuprof merge OUT trace_rank*.json``).

torch is never imported here: it is looked up in ``sys.modules``, so a
program that does not use it never pays for it. See docs/distributed.md.
"""

from __future__ import annotations

from ...core._ranks import distributed_info, expand_name, rank_info
from ._checks import RANK_CHECKS, diagnose_ranks
from ._merged import COLLECTIVES_DTYPE, RANK_STEP_DTYPE, SLOWEST_DTYPE, MergedRun, merge
from ._overlap import OVERLAP_DTYPE, STEP_FIELDS, comm_overlap
from ._traces import collective_name

__all__ = [
    "COLLECTIVES_DTYPE",
    "OVERLAP_DTYPE",
    "RANK_CHECKS",
    "RANK_STEP_DTYPE",
    "SLOWEST_DTYPE",
    "STEP_FIELDS",
    "MergedRun",
    "collective_name",
    "comm_overlap",
    "diagnose_ranks",
    "distributed_info",
    "expand_name",
    "merge",
    "rank_info",
]
