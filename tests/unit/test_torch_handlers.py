"""torch.profiler's own ``on_trace_ready`` callbacks given to ``gpuprof.profile``: the
likeliest half-finished migration. torch's ``tensorboard_trace_handler`` writes a trace
the TensorBoard plugin reads; a callback written for torch.profiler (the recipe's
``trace_handler``) runs; a callback that raises names itself and profiling goes on."""

import os

import gpuprof
import pytest
from test_exporters import check_schema, read_trace

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install torch)")


def train(prof, steps, width=16):
    """A real CPU training loop with an optimizer, prof.step() after each step."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        loss = model(torch.randn(4, width)).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        prof.step()


def schedule(active=2):
    return gpuprof.schedule(wait=1, warmup=1, active=active)


@pytest.mark.parametrize("use_gzip", [False, True])
def test_torch_tensorboard_handler_writes_a_trace_the_plugin_reads(tmp_path, use_gzip):
    data = pytest.importorskip(
        "torch_tb_profiler.profiler.data",
        reason="the TensorBoard profiler plugin is not installed (pip install torch-tb-profiler)",
    )
    from torch_tb_profiler import consts

    logdir = str(tmp_path / "tb")
    handler = torch.profiler.tensorboard_trace_handler(logdir, use_gzip=use_gzip)
    with gpuprof.profile(schedule=schedule(active=3), on_trace_ready=handler) as prof:
        train(prof, 5)
    (name,) = os.listdir(logdir)
    assert name.endswith(".pt.trace.json.gz" if use_gzip else ".pt.trace.json")
    path = os.path.join(logdir, name)
    check_schema(*read_trace(path))
    match = consts.WORKER_PATTERN.match(name)
    run = data.RunProfileData.parse(match.group(1), match.group(2), path, logdir)
    steps = prof.steps()
    assert run.steps_names == [str(s) for s in steps["step"]] == ["2", "3", "4"]
    assert run.has_runtime is False and run.used_devices == []  # a CPU-only trace
    # each plugin step spans the step gpuprof measured (to a microsecond)
    walls_us = (steps["end_ns"] - steps["start_ns"]) / 1e3
    totals = [c.costs[-1] for c in run.steps_costs]  # ProfileRole.Total
    assert totals == pytest.approx(walls_us.tolist(), abs=1.0)


def test_torch_recipe_callback_runs_inside_prof_step(tmp_path):
    """The callback of torch's profiler recipe, written for torch.profiler: tables with
    torch's arguments, a trace per window named by step_num, stacks, all of torch's
    keyword arguments."""
    seen = []

    def trace_handler(p):
        table = p.key_averages(group_by_input_shape=True, group_by_overload_name=True).table(
            sort_by="self_cuda_time_total", row_limit=-1, max_name_column_width=40
        )
        trace = str(tmp_path / f"trace_{p.step_num}.json")
        p.export_chrome_trace(trace, use_python_export=True)
        stacks = p.export_stacks(str(tmp_path / f"stacks_{p.step_num}.txt"), "self_cpu_time_total")
        seen.append((p.step_num, table, trace, stacks))

    with pytest.warns(UserWarning, match="no input shapes were recorded"):
        with gpuprof.profile(
            schedule=gpuprof.schedule(wait=1, warmup=1, active=2, repeat=2),
            on_trace_ready=trace_handler,
        ) as prof:
            train(prof, 8)
    assert [s[0] for s in seen] == [4, 8]
    for _, table, trace, stacks in seen:
        assert "Linear.forward" in table and "SGD.step" in table
        check_schema(*read_trace(trace))
        with open(stacks) as f:
            assert "SGD.step" in f.read()


def test_gpuprof_handler_takes_torch_arguments(tmp_path):
    handler = gpuprof.tensorboard_trace_handler(tmp_path, None, False, True)  # torch's order
    with gpuprof.profile(schedule=schedule(), on_trace_ready=handler) as prof:
        train(prof, 4)
    (name,) = os.listdir(tmp_path)
    check_schema(*read_trace(tmp_path / name))
    with pytest.raises(TypeError, match="use_python_export"):
        gpuprof.tensorboard_trace_handler(tmp_path, use_python_export="yes")
    with pytest.raises(TypeError, match="use_python_export"):
        prof.export_chrome_trace(tmp_path / "t.json", use_python_export=None)


def test_a_raising_callback_is_named_and_profiling_goes_on(tmp_path):
    windows = []

    def flaky_upload(p):
        windows.append(list(p.steps()["step"]))
        if len(windows) == 1:
            raise ConnectionError("upload failed")

    caught = []
    with gpuprof.profile(
        schedule=gpuprof.schedule(wait=0, warmup=1, active=2, repeat=3),
        on_trace_ready=flaky_upload,
    ) as prof:
        torch.manual_seed(0)
        x = torch.randn(8, 8)
        for _ in range(9):
            x = torch.tanh(x @ x)
            try:
                prof.step()
            except ConnectionError as e:  # torch lets it propagate too
                caught.append(e)
    (e,) = caught
    assert str(e) == "upload failed"
    notes = getattr(e, "__notes__", [])
    if notes:  # Python 3.11+; 3.10 prints the line to stderr
        assert "on_trace_ready=" in notes[0] and "flaky_upload" in notes[0]
        assert "at step 3" in notes[0]
    # the window after the failed callback was recorded in full
    assert windows == [[1, 2], [4, 5], [7, 8]]
