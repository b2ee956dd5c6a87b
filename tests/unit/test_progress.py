"""Progress lines for long operations: on stderr, only when asked or on a large job at a tty."""

import gpuprof


def _profile(n):
    with gpuprof.profile(activities=[gpuprof.ProfilerActivity.CPU]) as prof:
        for i in range(n):
            abs(i)
    return prof


def test_progress_lines_when_forced(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("GPUPROF_PROGRESS", "1")
    prof = _profile(100)
    err = capsys.readouterr().err
    assert "gpuprof: closed the recorded window (" in err
    prof.export_chrome_trace(tmp_path / "t.json")
    prof.save(tmp_path / "p.gpuprof")
    err = capsys.readouterr().err
    assert f"gpuprof: writing {tmp_path / 't.json'}" in err
    assert f"gpuprof: saving {tmp_path / 'p.gpuprof'}" in err
    assert err.count("done in") == 2


def test_no_progress_when_not_a_terminal(monkeypatch, capsys, tmp_path):
    monkeypatch.delenv("GPUPROF_PROGRESS", raising=False)
    prof = _profile(100)
    prof.export_chrome_trace(tmp_path / "t.json")
    assert "gpuprof:" not in capsys.readouterr().err  # pytest's stderr is not a tty


def test_failed_operations_say_so(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("GPUPROF_PROGRESS", "1")
    prof = _profile(10)
    capsys.readouterr()
    try:
        prof.export_chrome_trace(tmp_path)  # a directory
    except OSError:
        pass
    assert "failed in" in capsys.readouterr().err
