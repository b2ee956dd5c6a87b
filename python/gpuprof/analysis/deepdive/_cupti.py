"""The CUPTI range profiler through ctypes: every kernel of a replay is one
range, replayed as many times as the metrics need (see gpuprof.analysis.deepdive)."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

from ._report import (
    _CUPTI_EXPLAIN,
    METRICS,
    VIRTUAL_FIX,
    DeepDiveReport,
    _fields_from,
    _finish,
)

# -- CUPTI range profiler through ctypes ----------------------------------------------------

_sz = ctypes.c_size_t
_vp = ctypes.c_void_p
_cp = ctypes.c_char_p
_u8p = ctypes.POINTER(ctypes.c_uint8)


def _params(name: str, fields: list[tuple[str, object]]):
    """A CUPTI parameter struct: structSize and pPriv first; ``size`` is
    CUPTI_PROFILER_STRUCT_SIZE (the end of the last field, no tail padding)."""
    cls: Any = type(
        name, (ctypes.Structure,), {"_fields_": [("structSize", _sz), ("pPriv", _vp)] + fields}
    )
    last = getattr(cls, cls._fields_[-1][0])
    cls.size = last.offset + last.size
    return cls


#: Parameter structs by short name (entry point -> name in _ENTRY).
CUPTI_PARAMS = {
    "Initialize": _params("CUpti_Profiler_Initialize_Params", []),
    "DeInitialize": _params("CUpti_Profiler_DeInitialize_Params", []),
    "GetChipName": _params(
        "CUpti_Device_GetChipName_Params", [("deviceIndex", _sz), ("pChipName", _cp)]
    ),
    "GetCounterAvailability": _params(
        "CUpti_Profiler_GetCounterAvailability_Params",
        [("ctx", _vp), ("counterAvailabilityImageSize", _sz), ("pCounterAvailabilityImage", _u8p)],
    ),
    "DeviceSupported": _params(
        "CUpti_Profiler_DeviceSupported_Params",
        [
            ("cuDevice", ctypes.c_int),
            ("isSupported", ctypes.c_int),
            ("architecture", ctypes.c_int),
            ("sli", ctypes.c_int),
            ("vGpu", ctypes.c_int),
            ("confidentialCompute", ctypes.c_int),
            ("cmp", ctypes.c_int),
            ("wsl", ctypes.c_int),
            ("api", ctypes.c_int),
        ],
    ),
    "HostInitialize": _params(
        "CUpti_Profiler_Host_Initialize_Params",
        [
            ("profilerType", ctypes.c_int),
            ("pChipName", _cp),
            ("pCounterAvailabilityImage", _u8p),
            ("pHostObject", _vp),
        ],
    ),
    "HostDeinitialize": _params("CUpti_Profiler_Host_Deinitialize_Params", [("pHostObject", _vp)]),
    "HostGetMetricProperties": _params(
        "CUpti_Profiler_Host_GetMetricProperties_Params",
        [
            ("pHostObject", _vp),
            ("pMetricName", _cp),
            ("pDescription", _cp),
            ("pHwUnit", _cp),
            ("pDimUnit", _cp),
            ("metricType", ctypes.c_int),
        ],
    ),
    "HostConfigAddMetrics": _params(
        "CUpti_Profiler_Host_ConfigAddMetrics_Params",
        [("pHostObject", _vp), ("ppMetricNames", ctypes.POINTER(_cp)), ("numMetrics", _sz)],
    ),
    "HostGetConfigImageSize": _params(
        "CUpti_Profiler_Host_GetConfigImageSize_Params",
        [("pHostObject", _vp), ("configImageSize", _sz)],
    ),
    "HostGetConfigImage": _params(
        "CUpti_Profiler_Host_GetConfigImage_Params",
        [("pHostObject", _vp), ("configImageSize", _sz), ("pConfigImage", _u8p)],
    ),
    "HostGetNumOfPasses": _params(
        "CUpti_Profiler_Host_GetNumOfPasses_Params",
        [("configImageSize", _sz), ("pConfigImage", _u8p), ("numOfPasses", _sz)],
    ),
    "HostEvaluateToGpuValues": _params(
        "CUpti_Profiler_Host_EvaluateToGpuValues_Params",
        [
            ("pHostObject", _vp),
            ("pCounterDataImage", _u8p),
            ("counterDataImageSize", _sz),
            ("rangeIndex", _sz),
            ("ppMetricNames", ctypes.POINTER(_cp)),
            ("numMetrics", _sz),
            ("pMetricValues", ctypes.POINTER(ctypes.c_double)),
        ],
    ),
    "Enable": _params(
        "CUpti_RangeProfiler_Enable_Params", [("ctx", _vp), ("pRangeProfilerObject", _vp)]
    ),
    "Disable": _params("CUpti_RangeProfiler_Disable_Params", [("pRangeProfilerObject", _vp)]),
    "Start": _params("CUpti_RangeProfiler_Start_Params", [("pRangeProfilerObject", _vp)]),
    "Stop": _params(
        "CUpti_RangeProfiler_Stop_Params",
        [
            ("pRangeProfilerObject", _vp),
            ("passIndex", _sz),
            ("targetNestingLevel", _sz),
            ("isAllPassSubmitted", ctypes.c_uint8),
        ],
    ),
    "SetConfig": _params(
        "CUpti_RangeProfiler_SetConfig_Params",
        [
            ("pRangeProfilerObject", _vp),
            ("configSize", _sz),
            ("pConfig", _u8p),
            ("counterDataImageSize", _sz),
            ("pCounterDataImage", _u8p),
            ("range", ctypes.c_int),
            ("replayMode", ctypes.c_int),
            ("maxRangesPerPass", _sz),
            ("numNestingLevels", ctypes.c_uint16),
            ("minNestingLevel", ctypes.c_uint16),
            ("passIndex", _sz),
            ("targetNestingLevel", ctypes.c_uint16),
        ],
    ),
    "DecodeData": _params(
        "CUpti_RangeProfiler_DecodeData_Params",
        [("pRangeProfilerObject", _vp), ("numOfRangeDropped", _sz)],
    ),
    "GetCounterDataSize": _params(
        "CUpti_RangeProfiler_GetCounterDataSize_Params",
        [
            ("pRangeProfilerObject", _vp),
            ("pMetricNames", ctypes.POINTER(_cp)),
            ("numMetrics", _sz),
            ("maxNumOfRanges", _sz),
            ("maxNumRangeTreeNodes", ctypes.c_uint32),
            ("counterDataSize", _sz),
        ],
    ),
    "CounterDataImageInitialize": _params(
        "CUpti_RangeProfiler_CounterDataImage_Initialize_Params",
        [("pRangeProfilerObject", _vp), ("counterDataSize", _sz), ("pCounterData", _u8p)],
    ),
    "GetCounterDataInfo": _params(
        "CUpti_RangeProfiler_GetCounterDataInfo_Params",
        [("pCounterDataImage", _u8p), ("counterDataImageSize", _sz), ("numTotalRanges", _sz)],
    ),
}

# enum values (cupti_profiler_target.h, cupti_profiler_host.h)
CUPTI_AUTO_RANGE = 1
CUPTI_KERNEL_REPLAY = 2
CUPTI_PROFILER_TYPE_RANGE_PROFILER = 0
CUPTI_PROFILER_RANGE_PROFILING = 0
CUPTI_ERROR_NOT_INITIALIZED = 15
SUPPORT_UNKNOWN, SUPPORT_UNSUPPORTED, SUPPORT_DISABLED, SUPPORT_SUPPORTED = 0, 1, 2, 3

# entry point -> CUPTI_PARAMS key
_ENTRY = {
    "cuptiProfilerInitialize": "Initialize",
    "cuptiProfilerDeInitialize": "DeInitialize",
    "cuptiDeviceGetChipName": "GetChipName",
    "cuptiProfilerGetCounterAvailability": "GetCounterAvailability",
    "cuptiProfilerDeviceSupported": "DeviceSupported",
    "cuptiProfilerHostInitialize": "HostInitialize",
    "cuptiProfilerHostDeinitialize": "HostDeinitialize",
    "cuptiProfilerHostGetMetricProperties": "HostGetMetricProperties",
    "cuptiProfilerHostConfigAddMetrics": "HostConfigAddMetrics",
    "cuptiProfilerHostGetConfigImageSize": "HostGetConfigImageSize",
    "cuptiProfilerHostGetConfigImage": "HostGetConfigImage",
    "cuptiProfilerHostGetNumOfPasses": "HostGetNumOfPasses",
    "cuptiProfilerHostEvaluateToGpuValues": "HostEvaluateToGpuValues",
    "cuptiRangeProfilerEnable": "Enable",
    "cuptiRangeProfilerDisable": "Disable",
    "cuptiRangeProfilerStart": "Start",
    "cuptiRangeProfilerStop": "Stop",
    "cuptiRangeProfilerSetConfig": "SetConfig",
    "cuptiRangeProfilerDecodeData": "DecodeData",
    "cuptiRangeProfilerGetCounterDataSize": "GetCounterDataSize",
    "cuptiRangeProfilerCounterDataImageInitialize": "CounterDataImageInitialize",
    "cuptiRangeProfilerGetCounterDataInfo": "GetCounterDataInfo",
}


class _CuptiFailure(Exception):
    def __init__(self, call: str, code: int, text: str):
        super().__init__(f"{call} failed: {text} ({code})")
        self.call, self.code, self.text = call, code, text

    def explain(self) -> str:
        fix = _CUPTI_EXPLAIN.get(self.code)
        return f"{self} — {fix}" if fix else str(self)


class _Cupti:
    """The profiler entry points of an already-loaded libcupti, and libcuda's few."""

    def __init__(self, cupti_path: str, driver: bool = True):
        self.lib = ctypes.CDLL(cupti_path)
        self.fns = {}
        for entry in _ENTRY:
            try:
                fn = getattr(self.lib, entry)
            except AttributeError:
                raise RuntimeError(
                    f"libcupti at {cupti_path} lacks {entry}: the range "
                    "profiler needs CUPTI from CUDA 12.6 or newer"
                ) from None
            fn.restype = ctypes.c_int
            fn.argtypes = [_vp]
            self.fns[entry] = fn
        args: list[Any]  # ctypes argument types, of one kind or another
        for name, args in (
            ("cuptiSubscribe", [ctypes.POINTER(_vp), _vp, _vp]),
            ("cuptiUnsubscribe", [_vp]),
        ):
            f = getattr(self.lib, name)
            f.restype = ctypes.c_int
            f.argtypes = args
        self._result_string = self.lib.cuptiGetResultString
        self._result_string.restype = ctypes.c_int
        self._result_string.argtypes = [ctypes.c_int, ctypes.POINTER(_cp)]
        if not driver:  # the host API alone (metric names, config images) needs no GPU
            return
        self.cuda = ctypes.CDLL("libcuda.so.1")
        for name, args in (
            ("cuCtxGetCurrent", [ctypes.POINTER(_vp)]),
            ("cuCtxGetDevice", [ctypes.POINTER(ctypes.c_int)]),
            ("cuCtxSynchronize", []),
        ):
            f = getattr(self.cuda, name)
            f.restype = ctypes.c_int
            f.argtypes = args

    def text(self, code: int) -> str:
        s = _cp()
        if self._result_string(code, ctypes.byref(s)) == 0 and s.value:
            return s.value.decode(errors="replace")
        return "unknown CUPTI result"

    def new(self, entry: str, **kw):
        p = CUPTI_PARAMS[_ENTRY[entry]]()
        p.structSize = type(p).size
        for k, v in kw.items():
            setattr(p, k, v)
        return p

    def call(self, entry: str, p=None, **kw):
        if p is None:
            p = self.new(entry, **kw)
        code = self.fns[entry](ctypes.addressof(p))
        if code != 0:
            raise _CuptiFailure(entry, code, self.text(code))
        return p


def _profiler_initialize(api: _Cupti) -> Callable[[], None]:
    """cuptiProfilerInitialize, attaching CUPTI first when it is detached.

    A gpuprof profile detaches CUPTI when it stops (cuptiFinalize), so that
    nothing lingers in the program; the profiler API then answers
    CUPTI_ERROR_NOT_INITIALIZED until a client attaches CUPTI again. A
    subscription without callbacks does that. Returns what undoes it, to call
    after cuptiProfilerDeInitialize.
    """
    try:
        api.call("cuptiProfilerInitialize")
        return lambda: None
    except _CuptiFailure as e:
        if e.code != CUPTI_ERROR_NOT_INITIALIZED:
            raise
    handle = _vp()
    code = api.lib.cuptiSubscribe(ctypes.byref(handle), None, None)
    if code != 0:
        raise _CuptiFailure("cuptiSubscribe", code, api.text(code))
    try:
        api.call("cuptiProfilerInitialize")
    except BaseException:
        api.lib.cuptiUnsubscribe(handle)
        raise
    return lambda: api.lib.cuptiUnsubscribe(handle)


def _names(strings: list[str]):
    arr = (_cp * len(strings))(*[s.encode() for s in strings])
    return arr


def _device_support_reason(s) -> str | None:
    if s.isSupported == SUPPORT_SUPPORTED:
        return None
    parts = []
    if s.architecture == SUPPORT_UNSUPPORTED:
        parts.append("the GPU is older than compute capability 7.0")
    if s.vGpu == SUPPORT_DISABLED:
        parts.append(VIRTUAL_FIX)
    elif s.vGpu == SUPPORT_UNSUPPORTED:
        parts.append("this virtual GPU does not support performance counters")
    if s.confidentialCompute == SUPPORT_UNSUPPORTED:
        parts.append(_CUPTI_EXPLAIN[41])
    if s.cmp == SUPPORT_UNSUPPORTED:
        parts.append(_CUPTI_EXPLAIN[42])
    if s.sli == SUPPORT_UNSUPPORTED:
        parts.append(_CUPTI_EXPLAIN[44])
    if s.wsl == SUPPORT_UNSUPPORTED:
        parts.append(_CUPTI_EXPLAIN[45])
    return "; ".join(parts) or "CUPTI reports that this device does not support profiling"


def _run_cupti(
    report: DeepDiveReport, replay, max_kernels: int, kernel_sequence
) -> tuple[bool, str]:
    from ...record import _cuda

    st = _cuda.cuda_status()
    if not st["usable"]:
        return False, st["reason"] or "GPU capture is not usable here"
    try:
        api = _Cupti(st["library"] or "libcupti.so")
    except (OSError, RuntimeError) as e:
        return False, str(e)
    try:
        return _collect_cupti(api, report, replay, max_kernels, kernel_sequence)
    except _CuptiFailure as e:
        return False, e.explain()


def _supported_metrics(api: _Cupti, host) -> tuple[list[str], dict[str, list[str]]]:
    """The metric names this chip knows, and field -> the names used for it."""
    chosen: dict[str, list[str]] = {}
    for spec in METRICS:
        ok = []
        for m in spec.candidates:
            try:
                api.call(
                    "cuptiProfilerHostGetMetricProperties", pHostObject=host, pMetricName=m.encode()
                )
            except _CuptiFailure:
                continue
            ok.append(m)
            if spec.combine == "first":
                break
        if ok:
            chosen[spec.field] = ok
    names = sorted({m for v in chosen.values() for m in v})
    return names, chosen


def _collect_cupti(api: _Cupti, report: DeepDiveReport, replay, max_kernels: int, kernel_sequence):
    # 1. name the kernels (this also initialises CUDA when nothing has yet)
    launched = kernel_sequence(replay)
    report.replays += 1
    ctx = _vp()
    if api.cuda.cuCtxGetCurrent(ctypes.byref(ctx)) != 0 or not ctx.value:
        return False, (
            "no CUDA context is current on this thread after running replay(); "
            "call deep_dive from the thread that runs the GPU work"
        )
    dev = ctypes.c_int()
    if api.cuda.cuCtxGetDevice(ctypes.byref(dev)) != 0:
        return False, "cuCtxGetDevice failed on the current CUDA context"
    device = dev.value
    sequence = [name for name, d in launched if d == device]
    if not sequence:
        return False, f"replay() launched no kernels on device {device} (the current context's)"
    wanted = {k.name for k in report.kernels if k.device == device}
    if not wanted & set(sequence):
        return False, (
            "replay() did not launch any of the top kernels of the recorded window "
            f"on device {device} (it launched {len(sequence)} others): pass a replay "
            "that runs the same work"
        )

    # 2. measure them
    detach = _profiler_initialize(api)
    host = None
    obj = None
    try:
        sup = api.call(
            "cuptiProfilerDeviceSupported", cuDevice=device, api=CUPTI_PROFILER_RANGE_PROFILING
        )
        why = _device_support_reason(sup)
        if why:
            return False, why
        chip = api.call("cuptiDeviceGetChipName", deviceIndex=device).pChipName
        avail = api.call("cuptiProfilerGetCounterAvailability", ctx=ctx)
        image = (ctypes.c_uint8 * max(avail.counterAvailabilityImageSize, 1))()
        api.call(
            "cuptiProfilerGetCounterAvailability",
            ctx=ctx,
            counterAvailabilityImageSize=avail.counterAvailabilityImageSize,
            pCounterAvailabilityImage=image,
        )
        host = api.call(
            "cuptiProfilerHostInitialize",
            profilerType=CUPTI_PROFILER_TYPE_RANGE_PROFILER,
            pChipName=chip,
            pCounterAvailabilityImage=image,
        ).pHostObject
        names, chosen = _supported_metrics(api, host)
        if "sm_pct" not in chosen or "dram_pct" not in chosen:
            return False, (
                f"CUPTI on chip {chip.decode(errors='replace')} offers neither "
                "sm__throughput nor dram__throughput metrics"
            )
        try:
            size, config = _config_image(api, host, names)
        except _CuptiFailure as e:
            # Instruction-mix (_sass_) counters are the likeliest to be refused (older
            # chips, some drivers): keep the throughput metrics and drop FLOP/s.
            names = [m for m in names if "_sass_" not in m]
            chosen = {f: [m for m in ms if m in names] for f, ms in chosen.items()}
            chosen = {f: ms for f, ms in chosen.items() if ms}
            _quiet(api, "cuptiProfilerHostDeinitialize", pHostObject=host)
            host = None
            host = api.call(
                "cuptiProfilerHostInitialize",
                profilerType=CUPTI_PROFILER_TYPE_RANGE_PROFILER,
                pChipName=chip,
                pCounterAvailabilityImage=image,
            ).pHostObject
            size, config = _config_image(api, host, names)
            report.notes.append(f"FLOP/s not measured: {e}")
        metric_names = _names(names)
        report.passes = int(
            api.call(
                "cuptiProfilerHostGetNumOfPasses", configImageSize=size, pConfigImage=config
            ).numOfPasses
        )

        n_ranges = min(len(sequence), max_kernels)
        obj = api.call("cuptiRangeProfilerEnable", ctx=ctx).pRangeProfilerObject
        csize = api.call(
            "cuptiRangeProfilerGetCounterDataSize",
            pRangeProfilerObject=obj,
            pMetricNames=metric_names,
            numMetrics=len(names),
            maxNumOfRanges=n_ranges,
            maxNumRangeTreeNodes=n_ranges,
        ).counterDataSize
        counter = (ctypes.c_uint8 * csize)()
        api.call(
            "cuptiRangeProfilerCounterDataImageInitialize",
            pRangeProfilerObject=obj,
            counterDataSize=csize,
            pCounterData=counter,
        )
        pass_index, target_level = 0, 1
        for _ in range(max(report.passes, 1) + 1):
            api.call(
                "cuptiRangeProfilerSetConfig",
                pRangeProfilerObject=obj,
                configSize=size,
                pConfig=config,
                counterDataImageSize=csize,
                pCounterDataImage=counter,
                range=CUPTI_AUTO_RANGE,
                replayMode=CUPTI_KERNEL_REPLAY,
                maxRangesPerPass=n_ranges,
                numNestingLevels=1,
                minNestingLevel=1,
                passIndex=pass_index,
                targetNestingLevel=target_level,
            )
            api.call("cuptiRangeProfilerStart", pRangeProfilerObject=obj)
            try:
                replay()
                api.cuda.cuCtxSynchronize()
            finally:
                stop = api.call("cuptiRangeProfilerStop", pRangeProfilerObject=obj)
            report.replays += 1
            if stop.isAllPassSubmitted:
                break
            pass_index, target_level = stop.passIndex, max(int(stop.targetNestingLevel), 1)
        else:
            return False, "the range profiler did not finish its passes"
        dropped = api.call(
            "cuptiRangeProfilerDecodeData", pRangeProfilerObject=obj
        ).numOfRangeDropped
        n_got = api.call(
            "cuptiRangeProfilerGetCounterDataInfo",
            pCounterDataImage=counter,
            counterDataImageSize=csize,
        ).numTotalRanges
        values = (ctypes.c_double * len(names))()
        per_range: list[dict[str, float]] = []
        for i in range(n_got):
            api.call(
                "cuptiProfilerHostEvaluateToGpuValues",
                pHostObject=host,
                pCounterDataImage=counter,
                counterDataImageSize=csize,
                rangeIndex=i,
                ppMetricNames=metric_names,
                numMetrics=len(names),
                pMetricValues=values,
            )
            raw = dict(zip(names, values, strict=True))
            per_range.append(_fields_from(raw, chosen))
    finally:
        if obj is not None:
            _quiet(api, "cuptiRangeProfilerDisable", pRangeProfilerObject=obj)
        if host is not None:
            _quiet(api, "cuptiProfilerHostDeinitialize", pHostObject=host)
        _quiet(api, "cuptiProfilerDeInitialize")
        detach()

    if dropped:
        report.notes.append(
            f"{dropped} kernel launches past max_kernels={max_kernels} were not measured"
        )
    if len(per_range) > len(sequence) or (
        len(per_range) < len(sequence) and len(per_range) < max_kernels and not dropped
    ):
        return False, (
            f"replay() launched {len(sequence)} kernels when named but "
            f"{len(per_range)} under the profiler: make it launch the same kernels "
            "every time (warm it up first; disable autotuning such as "
            "torch.backends.cudnn.benchmark)"
        )
    per_kernel: dict[str, list[dict[str, float]]] = {}
    for name, vals in zip(sequence, per_range, strict=False):
        if name in wanted:
            per_kernel.setdefault(name, []).append(vals)
    report.backend = "cupti"
    report.available = True
    _finish(report, per_kernel)
    return True, ""


def _config_image(api: _Cupti, host, names: list[str]):
    """The config image that schedules ``names``: (size, ctypes buffer)."""
    api.call(
        "cuptiProfilerHostConfigAddMetrics",
        pHostObject=host,
        ppMetricNames=_names(names),
        numMetrics=len(names),
    )
    size = api.call("cuptiProfilerHostGetConfigImageSize", pHostObject=host).configImageSize
    config = (ctypes.c_uint8 * size)()
    api.call(
        "cuptiProfilerHostGetConfigImage",
        pHostObject=host,
        configImageSize=size,
        pConfigImage=config,
    )
    return size, config


def _quiet(api: _Cupti, entry: str, **kw) -> None:
    try:
        api.call(entry, **kw)
    except _CuptiFailure:
        pass  # teardown: the first failure is the one reported
