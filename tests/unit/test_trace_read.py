"""gpuprof.core._trace_read.read_trace: the one reader of Chrome traces (merge, report)."""

import gzip
import json

import pytest
from gpuprof.core._trace_read import read_trace

EVENTS = [{"ph": "X", "name": "f", "ts": 1.0, "dur": 2.0, "pid": 1, "tid": 1}]


def test_reads_plain_gzip_and_array_forms(tmp_path):
    plain = tmp_path / "a.json"
    plain.write_text(json.dumps({"traceEvents": EVENTS, "x": 1}))
    packed = tmp_path / "b.json"  # gzip told by its magic, not by the name
    packed.write_bytes(gzip.compress(json.dumps({"traceEvents": EVENTS}).encode()))
    bare = tmp_path / "c.json"
    bare.write_text(json.dumps(EVENTS))
    assert read_trace(str(plain), "f") == {"traceEvents": EVENTS, "x": 1}
    assert read_trace(str(packed), "f")["traceEvents"] == EVENTS
    assert read_trace(str(bare), "f") == {"traceEvents": EVENTS}


def test_errors_name_the_caller_and_the_file(tmp_path):
    missing = str(tmp_path / "missing.json")
    with pytest.raises(OSError, match=r"merge\(\): cannot read .*missing\.json"):
        read_trace(missing, "merge")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match=r"^report\(\): .*bad\.json' is not a JSON trace"):
        read_trace(str(bad), "report")
    empty = tmp_path / "e.json"
    empty.write_text("{}")
    with pytest.raises(ValueError, match="has no traceEvents list"):
        read_trace(str(empty), "merge")
