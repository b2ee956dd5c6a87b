"""On-demand capture, the armed process's side (docs/on-demand.md).

Armed, a process records nothing and has no profile hook and no CUPTI: it
counts step boundaries (PyTorch optimizer steps or ``step_fn``, through
``gpuprof.core._steps``, or :meth:`OnDemand.step` calls) and keeps one thread
asleep on a pipe, without the GIL. A request (files described in ``_proto``)
wakes that thread: the signal's handler only writes one byte to the pipe;
without a signal, or when the program has replaced the handler, the thread
reads the requests every ``poll_interval_s`` anyway.

The thread answers at once. A capture it accepts starts at the next step
boundary, on the thread that reached it, records N steps (or S seconds of whole
steps) there and stops there; a process that has found no step yet records a
``duration`` capture as a time window started and stopped by this thread. A
writer thread then writes the files, so the program goes on meanwhile, and only
then is the process free for the next capture: a request that comes while one
is recording or writing is refused with a message saying so.

A capture's request, state, answers and files are ``_capture``'s.

Nothing here runs inside the program's own code except the step count
(``found += 1`` and one attribute test per step while idle), and nothing here
raises into it: failures go to the requester's reply and one line on stderr.

The modules, by job (each module's layer is in tests/unit/test_architecture.py):

- ``_proto`` (core): the folders and files an armed process and ``gpuprof
  capture`` share, and the process checks;
- ``_capture`` (recording): one capture's request, state, answers and files;
- ``_armed`` (api): :class:`OnDemand` and ``arm()``, ``armed()``, ``disarm()``;
- ``_captures`` (api): a capture, from the step boundary that starts it to its
  files;
- ``_requests`` (api): the on-demand thread, which reads and answers requests;
- ``_environment`` (api): arming from ``GPUPROF_ON_DEMAND=1``;
- ``_shared`` (api): one line on stderr, the lowered switch interval;
- ``_client`` (cli): ``gpuprof capture``, the requester's side: the start step,
  the answers judged, the wait for the files;
- ``_targets`` (cli): the armed processes ``gpuprof capture`` can ask, checked;
- ``_exchange`` (cli): one request, the folder for its answers, the waits.

This module (api) names what the rest of gpuprof uses.
"""

from __future__ import annotations

from ...record import _ondemand_capture as capture_  # noqa: F401 - tests replace capture_.write_files
from ...record._ondemand_capture import (
    DEFAULT_STEPS,  # noqa: F401 - run --on-demand names it
    CaptureRequest,
)
from ._armed import (
    OnDemand,
    _install,  # noqa: F401 - run --on-demand arms the OnDemand it made
    arm,
    armed,
    disarm,
)
from ._environment import (
    _not_for_environment,  # noqa: F401 - tested
    arm_from_environment,
)

__all__ = ["OnDemand", "CaptureRequest", "arm", "armed", "disarm", "arm_from_environment"]
