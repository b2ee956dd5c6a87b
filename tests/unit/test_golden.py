"""Golden files: the same recorded data gives byte-identical output.

One synthetic recording (two threads, nested Python calls and record_function ranges,
two steps, CUDA API calls that launch kernels, copies, a memset, a sync and a device
allocation on two streams) goes through the real C aggregation once. Its Chrome trace
(the C writer, csrc/trace/trace_json*.c, behind ``export_chrome_trace``) and its
``key_averages().table()`` text are compared byte for byte with the files under
tests/data/golden. A change to either output fails here; when the change is meant,
regenerate with ``GPUPROF_UPDATE_GOLDEN=1 pytest tests/unit/test_golden.py`` and review
the diff of the golden files in the same commit.
"""

import os
import pathlib

import pytest
from gpuprof import _gpuprof
from gpuprof.exporters import export_chrome_trace, export_stacks
from gpuprof.results._results import Results
from gpuprof.results.tables import KeyAverages

C = _gpuprof._test_constants()
GOLDEN = pathlib.Path(__file__).resolve().parent.parent / "data" / "golden"
UPDATE = os.environ.get("GPUPROF_UPDATE_GOLDEN") == "1"

LAUNCH, MEMCPY, MEMSET, MALLOC, DEVSYNC = 211, 41, 116, 20, 165
API_NAMES = {
    LAUNCH: "cudaLaunchKernel",
    MEMCPY: "cudaMemcpyAsync",
    MEMSET: "cudaMemsetAsync",
    MALLOC: "cudaMalloc",
    DEVSYNC: "cudaDeviceSynchronize",
}

# Code objects with a fixed file name, so that the output does not depend on where the
# checkout lies.
_SRC = """
def train_step():
    pass

def forward():
    pass

def loss_fn():
    pass
"""
_NS: dict = {}
exec(compile(_SRC, "golden_model.py", "exec"), _NS)
TRAIN, FORWARD, LOSS, R_FWD, R_ATTN, R_OPT = 2, 3, 4, 5, 6, 7
OPS = [
    (C["OP_PYTHON"], _NS["train_step"].__code__, 0),
    (C["OP_PYTHON"], _NS["forward"].__code__, 0),
    (C["OP_PYTHON"], _NS["loss_fn"].__code__, 0),
    (C["OP_USER"], "forward", 0),
    (C["OP_USER"], "attn", 0),
    (C["OP_USER"], "optimizer", 0),
]
META = {
    "pid": 4242,
    "process_name": "golden",
    "distributed_info": {"rank": 0, "world_size": 1},
    "thread_names": {"1": "MainThread", "2": "loader"},
    "device_properties": [
        {
            "id": 0,
            "name": "Golden GPU",
            "totalGlobalMem": 1 << 34,
            "computeMajor": 9,
            "computeMinor": 0,
            "numSms": 132,
            "warpSize": 32,
            "maxThreadsPerBlock": 1024,
            "maxThreadsPerMultiProcessor": 2048,
            "regsPerBlock": 65536,
            "regsPerMultiprocessor": 65536,
            "sharedMemPerBlock": 49152,
            "sharedMemPerMultiprocessor": 233472,
        }
    ],
}


def api_key(cbid):
    return _gpuprof._test_api_key(C["API_RUNTIME"], cbid)["key"]


def recording():
    """Results of the synthetic recording (times in ns)."""
    main, gpu = [], []
    corr = [0]

    def launch(t, stream, start, end, kind="GPU_KERNEL", cbid=LAUNCH, **kw):
        corr[0] += 1
        main.append((t, C["EV_API_ENTER"], corr[0], api_key(cbid)))
        main.append((t + 3, C["EV_API_EXIT"], corr[0]))
        gpu.append(
            dict(
                kind=C[kind],
                correlation=corr[0],
                start_ns=start,
                end_ns=end,
                stream=stream,
                device=0,
                **kw,
            )
        )

    for step in range(2):
        base = 1000 + step * 10_000
        main.append((base, C["EV_STEP_BEGIN"], step))
        main.append((base + 10, C["EV_CALL"], TRAIN))
        main.append((base + 20, C["EV_RANGE_PUSH"], R_FWD))
        main.append((base + 30, C["EV_CALL"], FORWARD))
        launch(
            base + 40,
            7,
            base + 2000,
            base + 2600,
            name_id=0,
            registers=32,
            grid_x=8,
            block_x=256,
            shared_mem=1024,
        )
        main.append((base + 50, C["EV_RANGE_PUSH"], R_ATTN))
        launch(
            base + 60, 7, base + 2600, base + 3100, name_id=1, registers=64, grid_x=132, block_x=128
        )
        launch(
            base + 70,
            20,
            base + 2100,
            base + 2300,
            kind="GPU_MEMCPY",
            cbid=MEMCPY,
            bytes=1 << 16,
            subkind=C["COPY_HTOD"],
            src_mem=C["MEM_PINNED"],
            dst_mem=C["MEM_DEVICE"],
        )
        main.append((base + 80, C["EV_RANGE_POP"], R_ATTN))
        main.append((base + 90, C["EV_RETURN"], FORWARD))
        main.append((base + 100, C["EV_RANGE_POP"], R_FWD))
        main.append((base + 110, C["EV_CALL"], LOSS))
        launch(
            base + 120,
            20,
            base + 3200,
            base + 3250,
            kind="GPU_MEMSET",
            cbid=MEMSET,
            bytes=4096,
            dst_mem=C["MEM_DEVICE"],
        )
        if step == 0:
            launch(
                base + 130,
                7,
                base + 130,
                base + 130,
                kind="GPU_MALLOC",
                cbid=MALLOC,
                bytes=1 << 20,
                address=0x7000,
                dst_mem=C["MEM_DEVICE"],
            )
        main.append((base + 140, C["EV_RETURN"], LOSS))
        main.append((base + 150, C["EV_RANGE_PUSH"], R_OPT))
        launch(
            base + 160, 7, base + 3300, base + 3900, name_id=2, registers=16, grid_x=1, block_x=32
        )
        launch(
            base + 170,
            0,
            base + 173,
            base + 4000,
            kind="GPU_SYNC",
            cbid=DEVSYNC,
            subkind=C["SYNC_STREAM"],
        )
        main.append((base + 4010, C["EV_RANGE_POP"], R_OPT))
        main.append((base + 4020, C["EV_RETURN"], TRAIN))
        main.append((base + 5000, C["EV_STEP_END"], step))
    loader = [
        (1500, C["EV_CALL"], LOSS),
        (2500, C["EV_RETURN"], LOSS),
        (12_000, C["EV_RANGE_PUSH"], R_FWD),
        (12_900, C["EV_RANGE_POP"], R_FWD),
    ]
    # microseconds to ns, so that the tables show figures of a real run
    main = [(e[0] * 1000,) + e[1:] for e in main]
    loader = [(e[0] * 1000,) + e[1:] for e in loader]
    for g in gpu:
        g["start_ns"] *= 1000
        g["end_ns"] *= 1000
    raw = _gpuprof._test_aggregate(
        OPS,
        [(1, 101, main), (2, 102, loader)],
        gpu,
        0,
        30_000_000,
        ["_Z6kernelv", "_Z4gemmPfS_", "_Z4stepv"],
        1,
    )
    raw["epoch_offset_ns"] = 1_700_000_000_000_000_000  # the live clock's, else
    # CUDA API names come from libcupti only on a machine with the driver: name them here
    for i, (kind, op) in enumerate(zip(raw["ops"]["kind"], raw["ops"]["op"], strict=True)):
        if kind == C["OP_CUDA_API"]:
            raw["op_names"][i] = API_NAMES[int(op) & 0xFFFFF]
    return Results([raw], cuda={"active": True, "mode": "callbacks", "error": None}, meta=META)


def check(name: str, data: bytes):
    path = GOLDEN / name
    if UPDATE:
        path.write_bytes(data)
        return
    assert path.exists(), f"{path} is missing: run with GPUPROF_UPDATE_GOLDEN=1"
    want = path.read_bytes()
    if data != want:
        new = path.with_name(path.name + ".new")
        new.write_bytes(data)
        pytest.fail(
            f"{name} changed: compare {path} with {new} (diff -u); if the change is "
            f"meant, rerun with GPUPROF_UPDATE_GOLDEN=1 and commit the golden file"
        )


def normalized_trace(path) -> bytes:
    """The trace without the two lines that name the gpuprof version and the file."""
    data = pathlib.Path(path).read_bytes()
    assert data.count(b'"gpuprof_version": ') == 1, "the header names no gpuprof_version"
    assert data.count(b'"traceName": ') == 1, "the trace ends without traceName"
    out = []
    for line in data.split(b"\n"):
        if line.startswith(b'  "gpuprof_version": '):
            line = b'  "gpuprof_version": "X",'
        elif line.startswith(b'  "traceName": '):
            line = b'  "traceName": "t.json"'
        out.append(line)
    return b"\n".join(out)


def test_chrome_trace_is_byte_identical(tmp_path):
    export_chrome_trace(recording(), tmp_path / "t.json")
    check("trace.json", normalized_trace(tmp_path / "t.json"))


def test_chrome_trace_with_min_duration_is_byte_identical(tmp_path):
    export_chrome_trace(recording(), tmp_path / "t.json", min_duration_us=0.5)
    check("trace_min_duration.json", normalized_trace(tmp_path / "t.json"))


def test_key_averages_table_is_byte_identical():
    res = recording()
    text = KeyAverages(res, group_by_stack_n=0, show_memory=False).table(
        sort_by="self_cuda_time_total", row_limit=20
    )
    check("key_averages.txt", text.encode())
    text = KeyAverages(res, group_by_stack_n=0, show_memory=False).table(row_limit=20)
    check("key_averages_cpu.txt", text.encode())


def test_stacks_are_byte_identical(tmp_path):
    export_stacks(recording(), tmp_path / "s.txt", metric="self_cpu_time_total")
    check("stacks.txt", (tmp_path / "s.txt").read_bytes())


def test_the_recording_is_deterministic(tmp_path):
    export_chrome_trace(recording(), tmp_path / "a.json")
    export_chrome_trace(recording(), tmp_path / "b.json")
    assert normalized_trace(tmp_path / "a.json") == normalized_trace(tmp_path / "b.json")
