"""Synthetic timelines for the tests: one thread's hook events and the GPU's records,
written in time order and put through the real C aggregation
(``_gpuprof._test_aggregate``). tests/report_profiles.py (the HTML report's profiles)
and tests/unit/test_diagnose.py (the findings) build on :class:`Timeline`.
"""

from gpuprof import _gpuprof
from gpuprof.results._results import Results

C = _gpuprof._test_constants()
US = 1000


def api_key(cbid):
    """The recorded key of the CUPTI runtime callback id ``cbid``."""
    return _gpuprof._test_api_key(C["API_RUNTIME"], cbid)["key"]


class Timeline:
    """One thread's events and the GPU's records, written in time order."""

    KERNEL = {"registers": 32, "grid_x": 80, "block_x": 256}  # every kernel's launch shape

    def __init__(self):
        self.events = []
        self.gpu = []
        self.names = []
        self._corr = 0

    def ev(self, t, kind, *rest):
        """A hook event of ``kind`` (a name in ``_test_constants()``, "EV_CALL"...) at t."""
        self.events.append((t, C[kind]) + rest)

    def call(self, op, t):
        self.ev(t, "EV_CALL", op)

    def ret(self, t):
        self.ev(t, "EV_RETURN", 0)

    def api(self, cbid, t, dur):
        """A runtime API call of ``dur`` at t; its correlation id."""
        self._corr += 1
        self.ev(t, "EV_API_ENTER", self._corr, api_key(cbid))
        self.ev(t + dur, "EV_API_EXIT", self._corr)
        return self._corr

    def kernel(self, corr, start, end, name, stream=7, graph_id=0):
        if name not in self.names:
            self.names.append(name)
        self.gpu.append(
            dict(
                kind=C["GPU_KERNEL"],
                correlation=corr,
                start_ns=start,
                end_ns=end,
                name_id=self.names.index(name),
                stream=stream,
                device=0,
                **self.KERNEL,
                graph_id=graph_id,
            )
        )

    def memory(self, kind, corr, t, nbytes, address):
        """A device allocation ("GPU_MALLOC") or release ("GPU_FREE") at t."""
        self.gpu.append(
            dict(
                kind=C[kind],
                correlation=corr,
                start_ns=t,
                end_ns=t,
                bytes=nbytes,
                address=address,
                device=0,
                dst_mem=C["MEM_DEVICE"],
            )
        )

    def aggregate(self, ops, meta=None, api_names=None):
        """The timeline as :class:`Results`: ``ops`` the op table (op ids count from 2),
        ``meta`` added to the window's, ``api_names`` {cbid: name} for API calls."""
        end = max([e[0] for e in self.events] + [g["end_ns"] for g in self.gpu]) + US
        raw = _gpuprof._test_aggregate(
            ops, [(1, 101, self.events)], self.gpu, 0, end, self.names, 1
        )
        # libcupti names API calls only on a machine with the driver: name them here
        if api_names:
            for i, (kind, op) in enumerate(zip(raw["ops"]["kind"], raw["ops"]["op"])):
                if kind == C["OP_CUDA_API"]:
                    raw["op_names"][i] = api_names[int(op) & 0xFFFFF]
        # device_properties given: occupancy never asks a live CUDA for them
        return Results(
            [raw],
            cuda={"active": True, "mode": "callbacks", "error": None},
            meta={"device_properties": [], **(meta or {})},
        )
