"""The framework integrations on the CPU: Lightning's ``Trainer.fit`` with
``GpuprofProfiler``, Hugging Face's ``Trainer`` with ``GpuprofCallback``, and an
``accelerate`` loop with ``gpuprof.integrations.accelerate.profile``: which steps are
recorded, the step metrics the framework's logger receives (read back from a
CSVLogger, ``trainer.state.log_history`` and an accelerate tracker), the files, the
summary, and what happens when training raises.

Every framework is real (installed by ``make frameworks``); a test whose framework is
missing skips with the reason.
"""

import csv
import glob
import gzip
import json
import os
import pickle
import re
import subprocess
import sys
import time

import gpuprof
import numpy as np
import pytest
from gpuprof.integrations import METRIC_NAMES, STEP_METRICS_DTYPE, _session

torch = pytest.importorskip("torch", reason="PyTorch is not installed (make frameworks)")

SCHEDULE = dict(wait=2, warmup=1, active=2)  # steps 3, 4 then 8, 9 are recorded
RECORDED = [3, 4, 8, 9]
SLEEP_S = 0.004  # a slow sample: the data wait of a step is at least its batch's sleeps
CPU_METRICS = {"gpuprof/step_time_ms", "gpuprof/data_wait_pct"}


@pytest.fixture(params=["per_window", "continuous"])
def mode(request, monkeypatch):
    """Both ways the integrations run gpuprof: started for each window
    (per_window=True) or once for the run (the default)."""
    monkeypatch.setattr(_session, "PER_WINDOW", request.param == "per_window")
    return request.param


class SlowSamples(torch.utils.data.Dataset):
    """Random regression samples, each taking ``sleep`` seconds to load."""

    def __init__(self, n=64, sleep=0.0):
        self.n, self.sleep = n, sleep
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 16, generator=g)
        self.y = torch.randn(n, 1, generator=g)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.sleep:
            time.sleep(self.sleep)
        return self.x[i], self.y[i]


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def trace_steps(path):
    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    return sorted(
        e["name"] for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")
    )


# ---- Lightning ---------------------------------------------------------------------------


def lightning_or_skip():
    return pytest.importorskip("lightning", reason="Lightning is not installed (make frameworks)")


def make_module(L, fail_at=None):
    class Regressor(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(
                torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)
            )

        def training_step(self, batch, batch_idx):
            if fail_at is not None and self.global_step == fail_at:
                raise RuntimeError("planted failure")
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log("loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    return Regressor()


def fit(
    L,
    tmp_path,
    profiler,
    *,
    max_steps=12,
    sleep=0.0,
    batch_size=2,
    logger=True,
    accumulate=1,
    fail_at=None,
):
    from lightning.pytorch.loggers import CSVLogger

    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=max_steps,
        profiler=profiler,
        logger=CSVLogger(str(tmp_path / "logs")) if logger else False,
        default_root_dir=str(tmp_path),
        log_every_n_steps=1,
        accumulate_grad_batches=accumulate,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    data = torch.utils.data.DataLoader(SlowSamples(sleep=sleep), batch_size=batch_size)
    trainer.fit(make_module(L, fail_at), data)
    return trainer


def test_lightning_fit_records_batches_and_logs_their_metrics_to_the_csv_logger(tmp_path, mode):
    L = lightning_or_skip()
    from gpuprof.integrations.lightning import GpuprofProfiler

    profiler = GpuprofProfiler(schedule=gpuprof.schedule(**SCHEDULE))
    trainer = fit(L, tmp_path, profiler, sleep=SLEEP_S)
    # steps are training batches, numbered from the first one
    steps = profiler.steps()
    assert steps.dtype == STEP_METRICS_DTYPE
    assert list(steps["step"]) == RECORDED
    assert (steps["end_ns"] > steps["start_ns"]).all()
    assert (steps["step_ns"] == steps["end_ns"] - steps["start_ns"]).all()
    # each batch of 2 samples slept 2 * SLEEP_S in Lightning's fetch: the data wait
    assert (steps["data_wait_ns"] >= 2 * SLEEP_S * 1e9).all()
    assert (steps["data_wait_ns"] < steps["step_ns"]).all()
    assert (steps["peak_memory_bytes"] == -1).all()  # no CUDA: not measured
    # the CSV logger got one row per recorded step, at the step Lightning logs that
    # batch's loss at (no accumulation: the batch's index)
    rows = read_csv(os.path.join(trainer.log_dir, "metrics.csv"))
    ours = [r for r in rows if r["gpuprof/step_time_ms"]]
    assert [int(r["step"]) for r in ours] == RECORDED
    loss_steps = {int(r["step"]) for r in rows if r.get("loss")}
    assert set(RECORDED) <= loss_steps
    for r, s in zip(ours, steps):
        assert float(r["gpuprof/step_time_ms"]) == pytest.approx(s["step_ns"] / 1e6)
        assert float(r["gpuprof/data_wait_pct"]) == pytest.approx(
            100 * s["data_wait_ns"] / s["step_ns"]
        )
    # GPU figures are left out without GPU capture, not written as zeros
    assert CPU_METRICS <= set(rows[0]) and "gpuprof/gpu_busy_pct" not in rows[0]
    # files: PyTorchProfiler's layout in the log dir, the last window's two steps
    traces = glob.glob(os.path.join(trainer.log_dir, "fit.*.pt.trace.json.gz"))
    assert len(traces) == 1 and profiler.files[0] == traces[0]
    assert trace_steps(traces[0]) == sorted(
        f"ProfilerStep#{k}" for k in ((8, 9) if mode == "continuous" else (1, 2))
    )  # a profile per window counts from 0
    loaded = gpuprof.load(os.path.join(trainer.log_dir, "fit.gpuprof"))
    assert len(loaded.steps()) == 2
    # the summary: the op table, the step metrics and the diagnosis
    text = profiler.summary()
    assert text.startswith("FIT Profiler Report (gpuprof)")
    assert "Self CPU" in text and "Step metrics" in text and "Data wait" in text
    assert "over 4 recorded steps, steps 3-9" in text
    assert (
        "Input pipeline stall: the training loop waits in "
        "[_TrainingEpochLoop].train_dataloader_next" in text
    )
    assert "hottest_inside=time.sleep" in text
    # ... and the model's modules, by instance: the LightningModule's net and its layers
    mods = text[text.index("Modules") :]
    assert "\nSequential  Sequential      2" in mods and "\n  2         Linear" in mods
    assert profiler.prof.key_averages().table().startswith("-")  # the last window's view


def test_lightning_data_wait_is_small_when_batches_are_in_memory(tmp_path):
    L = lightning_or_skip()
    from gpuprof.integrations.lightning import GpuprofProfiler

    profiler = GpuprofProfiler(
        schedule=gpuprof.schedule(wait=1, warmup=1, active=5, repeat=1), output=False
    )
    fit(L, tmp_path, profiler, max_steps=8, batch_size=64, logger=False)
    steps = profiler.steps()
    assert list(steps["step"]) == [2, 3, 4, 5, 6]
    assert (steps["data_wait_ns"] > 0).all()  # the fetch is timed...
    # ...and short (the median: on a loaded machine one fetch may be descheduled)
    assert np.median(steps["data_wait_ns"] / steps["step_ns"]) < 0.5
    assert profiler.files == []


def test_lightning_gradient_accumulation_steps_are_batches_logged_at_lightnings_step(tmp_path):
    L = lightning_or_skip()
    from gpuprof.integrations.lightning import GpuprofProfiler

    profiler = GpuprofProfiler(schedule=gpuprof.schedule(wait=3, warmup=1, active=2, repeat=1))
    trainer = fit(L, tmp_path, profiler, max_steps=4, accumulate=2)  # 8 batches
    assert list(profiler.steps()["step"]) == [4, 5]  # batches, not optimizer steps
    rows = read_csv(os.path.join(trainer.log_dir, "metrics.csv"))
    # Lightning logs batch k's metrics at the optimizer steps made before it: k // 2
    assert [int(r["step"]) for r in rows if r["gpuprof/step_time_ms"]] == [2, 2]


def test_lightning_output_and_filename_name_the_files(tmp_path):
    L = lightning_or_skip()
    from gpuprof.integrations.lightning import GpuprofProfiler

    out = tmp_path / "prof"
    profiler = GpuprofProfiler(
        schedule=gpuprof.schedule(wait=1, warmup=1, active=1, repeat=1),
        output=out,
        filename="perf",
        log_metrics=False,
    )
    trainer = fit(L, tmp_path, profiler, max_steps=4)
    names = sorted(os.listdir(out))
    assert len(names) == 3, names
    assert names[0].startswith("fit-perf.") and names[0].endswith(".pt.trace.json.gz")
    assert names[1:] == ["fit-perf.gpuprof", "fit-perf.txt"]  # .txt: Lightning's summary file
    assert "Step metrics" in (out / "fit-perf.txt").read_text()
    rows = read_csv(os.path.join(trainer.log_dir, "metrics.csv"))
    assert "gpuprof/step_time_ms" not in rows[0]  # log_metrics=False


def test_lightning_training_that_raises_stops_recording_and_keeps_the_files(tmp_path, mode):
    L = lightning_or_skip()
    from gpuprof.integrations.lightning import GpuprofProfiler

    profiler = GpuprofProfiler(schedule=gpuprof.schedule(wait=1, warmup=1, active=2))
    with pytest.raises(RuntimeError, match="planted failure"):
        fit(L, tmp_path, profiler, fail_at=6, logger=False)  # inside the second window
    assert sys.getprofile() is None
    assert list(profiler.steps()["step"]) == [2, 3]  # the complete window stays
    assert [os.path.basename(f).split(".")[-1] for f in profiler.files] == ["gz", "gpuprof"]
    assert len(gpuprof.load(profiler.files[1]).steps()) == 2


def test_lightning_calls_only_the_end_of_training_hook_of_the_profilers_callback(tmp_path):
    L = lightning_or_skip()
    from gpuprof.integrations.lightning import GpuprofProfiler

    class Watched(GpuprofProfiler):
        """Sees every action Lightning profiles (hook calls included)."""

        def start(self, action_name):
            self.seen.add(action_name)
            super().start(action_name)

    profiler = Watched(schedule=gpuprof.schedule(wait=1, warmup=1, active=1), output=False)
    profiler.seen = set()
    fit(L, tmp_path, profiler, max_steps=4, logger=False)
    # no per-batch hook of its own (each would cost every batch a profiled hook call):
    # only the end of training, and Callback's setup and teardown, once per fit
    assert sorted(a for a in profiler.seen if "GpuprofProfiler" in a) == [
        "[Callback]GpuprofProfiler.on_train_end",
        "[Callback]GpuprofProfiler.setup",
        "[Callback]GpuprofProfiler.teardown",
    ]
    assert list(profiler.steps()["step"]) == [2]


def test_lightning_profiler_pickles_as_ddp_spawn_needs(tmp_path):
    L = lightning_or_skip()
    from gpuprof.integrations.lightning import GpuprofProfiler

    profiler = GpuprofProfiler(schedule=gpuprof.schedule(wait=1, warmup=1, active=1), output=False)
    fit(L, tmp_path, profiler, max_steps=4, logger=False)  # the Trainer's references are set
    copy = pickle.loads(pickle.dumps(profiler))
    assert list(copy.steps()["step"]) == list(profiler.steps()["step"]) == [2]
    fit(L, tmp_path, copy, max_steps=6, logger=False)  # the copy profiles a new fit
    assert list(copy.steps()["step"]) == [2, 5]
    assert sys.getprofile() is None


def test_lightning_short_fit_says_no_window_was_recorded(tmp_path):
    L = lightning_or_skip()
    from gpuprof.integrations.lightning import GpuprofProfiler

    profiler = GpuprofProfiler(schedule=gpuprof.schedule(wait=10, warmup=1, active=1))
    fit(L, tmp_path, profiler, max_steps=3, logger=False)
    assert len(profiler.steps()) == 0 and profiler.files == []
    assert "No step was recorded: the run ended after 3 steps" in profiler.summary()


def test_lightning_validate_and_test_are_not_profiled(tmp_path):
    L = lightning_or_skip()
    from gpuprof.integrations.lightning import GpuprofProfiler

    class WithTest(type(make_module(L))):
        def test_step(self, batch, batch_idx):
            x, y = batch
            self.log("test_loss", torch.nn.functional.mse_loss(self.net(x), y))

    profiler = GpuprofProfiler(
        schedule=gpuprof.schedule(wait=0, warmup=1, active=1, repeat=1), output=False
    )
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=3,
        profiler=profiler,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    data = torch.utils.data.DataLoader(SlowSamples(), batch_size=4)
    model = WithTest()
    trainer.fit(model, data)
    fit_summary = profiler.summary()
    assert list(profiler.steps()["step"]) == [1]
    trainer.test(model, data, verbose=False)
    assert profiler.summary() == ""  # the test stage
    assert list(profiler.steps()["step"]) == [1]  # what fit recorded is still there
    assert "Step metrics" in fit_summary


def test_the_pytorch_lightning_package_name(tmp_path):
    pl = pytest.importorskip("pytorch_lightning", reason="pytorch_lightning is not installed")
    from gpuprof.integrations.pytorch_lightning import GpuprofProfiler

    profiler = GpuprofProfiler(
        schedule=gpuprof.schedule(wait=0, warmup=1, active=2, repeat=1), output=False
    )
    assert isinstance(profiler, pl.profilers.Profiler)
    fit(pl, tmp_path, profiler, max_steps=4, logger=False)
    assert list(profiler.steps()["step"]) == [1, 2]


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(output=3), TypeError, "output must be a folder"),
        (dict(log_metrics="yes"), TypeError, "log_metrics must be a bool"),
        (dict(row_limit=-2), ValueError, "row_limit must be an int >= -1"),
        (dict(acc_events=True), ValueError, "acc_events=True is not supported"),
        (dict(output="a", dirpath="b"), ValueError, "give output= or dirpath="),
        (dict(filename="a/b"), ValueError, "filename must be a file name"),
        (dict(schedule=3), TypeError, "schedule must be"),
        (dict(max_events=0), ValueError, "max_events must be a positive int"),
        (dict(sort_by="cpu"), ValueError, "sort_by must be None or a key_averages"),
    ],
)
def test_lightning_bad_arguments_are_named(kwargs, error, match):
    lightning_or_skip()
    from gpuprof.integrations.lightning import GpuprofProfiler

    with pytest.raises(error, match=match):
        GpuprofProfiler(**kwargs)


def test_lightning_output_that_is_a_file_is_refused(tmp_path):
    lightning_or_skip()
    from gpuprof.integrations.lightning import GpuprofProfiler

    f = tmp_path / "f"
    f.write_text("")
    with pytest.raises(ValueError, match="is a file; give a folder"):
        GpuprofProfiler(output=f)


# ---- Hugging Face Trainer --------------------------------------------------------------


def hf_or_skip():
    pytest.importorskip("transformers", reason="transformers is not installed (make frameworks)")
    pytest.importorskip("accelerate", reason="accelerate (needed by Trainer) is not installed")
    import transformers

    return transformers


class Tokens(torch.utils.data.Dataset):
    def __init__(self, sleep=0.0, n=128):
        self.sleep = sleep
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 64, (n, 8), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        if self.sleep:
            time.sleep(self.sleep)
        return {"input_ids": self.ids[i], "labels": self.ids[i].clone()}


def hf_train(transformers, tmp_path, callbacks, *, max_steps=10, sleep=0.0, accumulate=1):
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=64, n_positions=8, n_embd=16, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=0
    )
    model = transformers.GPT2LMHeadModel(config)  # built from a config: nothing downloaded
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "hf"),
        per_device_train_batch_size=2,
        max_steps=max_steps,
        gradient_accumulation_steps=accumulate,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=Tokens(sleep), callbacks=callbacks
    )
    trainer.train()
    return trainer


def test_hf_trainer_records_optimizer_steps_and_logs_through_trainer_log(tmp_path, mode):
    transformers = hf_or_skip()
    from gpuprof.integrations.transformers import GpuprofCallback

    class Reporter(transformers.TrainerCallback):
        """What a report_to integration sees: every on_log."""

        logs = []

        def on_log(self, args, state, control, logs=None, **kwargs):
            self.logs.append((state.global_step, dict(logs)))

    cb = GpuprofCallback(schedule=gpuprof.schedule(**SCHEDULE))
    reporter = Reporter()
    sleep = 0.025  # a stall even where a step of this model takes 100 ms (a loaded machine)
    trainer = hf_train(transformers, tmp_path, [cb, reporter], sleep=sleep)
    steps = cb.steps()
    assert list(steps["step"]) == RECORDED
    assert (steps["data_wait_ns"] >= 2 * sleep * 1e9).all()  # Trainer.get_batch_samples
    assert (steps["data_wait_ns"] < steps["step_ns"]).all()
    # each recorded step went through Trainer.log: log_history and every callback's on_log,
    # at the global step the window closed at (after steps 4 and 9: global steps 5, 10)
    history = [h for h in trainer.state.log_history if "gpuprof/step_time_ms" in h]
    assert [h["step"] for h in history] == [5, 5, 10, 10]
    for h, s in zip(history, steps):
        assert set(h) == CPU_METRICS | {"epoch", "step"}
        assert h["gpuprof/step_time_ms"] == pytest.approx(s["step_ns"] / 1e6)
        assert h["gpuprof/data_wait_pct"] == pytest.approx(100 * s["data_wait_ns"] / s["step_ns"])
    seen = [(step, logs) for step, logs in reporter.logs if "gpuprof/step_time_ms" in logs]
    assert [step for step, _ in seen] == [5, 5, 10, 10]
    # files in args.output_dir: the last window's trace, its arrays, the summary
    out = tmp_path / "hf"
    assert len(glob.glob(str(out / "gpuprof-train.*.pt.trace.json.gz"))) == 1
    assert len(gpuprof.load(str(out / "gpuprof-train.gpuprof")).steps()) == 2
    text = (out / "gpuprof-train.txt").read_text()
    assert text == cb.summary()
    assert "Self CPU" in text and "over 4 recorded steps, steps 3-9" in text
    assert "waits in Trainer.get_batch_samples" in text
    assert sys.getprofile() is None


def test_hf_gradient_accumulation_a_step_is_an_optimizer_step(tmp_path):
    transformers = hf_or_skip()
    from gpuprof.integrations.transformers import GpuprofCallback

    cb = GpuprofCallback(
        schedule=gpuprof.schedule(wait=1, warmup=1, active=2, repeat=1),
        output=False,
        log_metrics=False,
    )
    trainer = hf_train(transformers, tmp_path, [cb], max_steps=4, accumulate=3)
    assert list(cb.steps()["step"]) == [2, 3]
    # each recorded step ran 3 forward/backward passes
    ops = cb.prof.ops()
    backward = ops[ops["name"] == "torch._C._EngineBase.run_backward"]
    assert int(backward["calls"].sum()) == 2 * 3
    assert cb.files == [] and not any("gpuprof" in h for h in trainer.state.log_history[-1])


def test_hf_bad_arguments_are_named():
    hf_or_skip()
    from gpuprof.integrations.transformers import GpuprofCallback

    with pytest.raises(TypeError, match="GpuprofCallback\\(\\): log_metrics must be a bool"):
        GpuprofCallback(log_metrics=1)
    with pytest.raises(TypeError, match="GpuprofCallback\\(\\): output must be a folder"):
        GpuprofCallback(output=[])


# ---- accelerate --------------------------------------------------------------------------


def test_accelerate_loop_logs_to_the_accelerators_trackers(tmp_path, mode):
    pytest.importorskip("accelerate", reason="accelerate is not installed (make frameworks)")
    from accelerate import Accelerator
    from accelerate.tracking import GeneralTracker
    from gpuprof.integrations.accelerate import profile

    class Recorder(GeneralTracker):
        """A tracker, as W&B's or TensorBoard's: keeps what accelerator.log sends."""

        name = "recorder"
        requires_logging_directory = False

        def __init__(self):
            super().__init__()
            self.logged = []

        @property
        def tracker(self):
            return self.logged

        def store_init_configuration(self, values):
            pass

        def log(self, values, step=None, **kwargs):
            self.logged.append((step, dict(values)))

    recorder = Recorder()
    acc = Accelerator(cpu=True, log_with=[recorder])
    acc.init_trackers("run")
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(SlowSamples(n=24, sleep=SLEEP_S), batch_size=2)
    model, opt, loader = acc.prepare(model, opt, loader)
    with profile(acc, schedule=gpuprof.schedule(**SCHEDULE), output=tmp_path / "p") as prof:
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
            prof.step()
    acc.end_training()
    steps = prof.steps()
    assert list(steps["step"]) == RECORDED
    # the loop iterates accelerate's loader: its generator, resumed directly under the step
    assert (steps["data_wait_ns"] >= 2 * SLEEP_S * 1e9).all()
    assert [s for s, _ in recorder.logged] == RECORDED
    for (_, values), s in zip(recorder.logged, steps):
        assert set(values) == CPU_METRICS
        assert values["gpuprof/step_time_ms"] == pytest.approx(s["step_ns"] / 1e6)
    assert [os.path.basename(f) for f in prof.files][1] == "gpuprof-train.gpuprof"
    assert "waits in DataLoaderShard.__iter__" in prof.summary()


def test_accelerate_needs_an_accelerator():
    pytest.importorskip("accelerate", reason="accelerate is not installed (make frameworks)")
    from gpuprof.integrations.accelerate import profile

    with pytest.raises(TypeError, match="accelerator must be an accelerate.Accelerator"):
        profile(object())


# ---- what every integration shares ----------------------------------------------------------


def test_logged_metrics_are_shares_of_the_step_and_leave_out_what_was_not_measured():
    from gpuprof.integrations import logged_metrics

    row = np.zeros(1, dtype=STEP_METRICS_DTYPE)[0]
    row["step_ns"], row["data_wait_ns"], row["gpu_busy_ns"] = 4_000_000, 1_000_000, 3_000_000
    row["sync_wait_ns"], row["comm_ns"], row["kernels"] = 400_000, 200_000, 57
    row["peak_memory_bytes"] = -1
    assert logged_metrics(row, gpu=False) == {
        "gpuprof/step_time_ms": 4.0,
        "gpuprof/data_wait_pct": 25.0,
    }
    row["peak_memory_bytes"] = 3 * 2**20
    assert logged_metrics(row, gpu=True) == {
        "gpuprof/step_time_ms": 4.0,
        "gpuprof/data_wait_pct": 25.0,
        "gpuprof/gpu_busy_pct": 75.0,
        "gpuprof/sync_wait_pct": 10.0,
        "gpuprof/comm_pct": 5.0,
        "gpuprof/kernels": 57.0,
        "gpuprof/peak_memory_mib": 3.0,
    }
    assert set(logged_metrics(row, gpu=True)) == set(METRIC_NAMES)


def test_the_summary_table_gives_median_and_max_of_each_metric():
    from gpuprof.integrations._session import metrics_table

    rows = np.zeros(3, dtype=STEP_METRICS_DTYPE)
    rows["step"] = [99, 199, 299]
    rows["step_ns"] = [2_000_000, 4_000_000, 3_000_000]
    rows["data_wait_ns"] = [200_000, 400_000, 1_500_000]  # 10%, 10%, 50%
    rows["gpu_busy_ns"] = [1_000_000, 1_000_000, 3_000_000]  # 50%, 25%, 100%
    rows["kernels"] = [10, 30, 20]
    rows["peak_memory_bytes"] = [-1, 100 * 2**20, 300 * 2**20]  # the first not measured

    def cells(table):
        """{metric: [median, max]} of the table's text."""
        rows = [re.split(r"\s{2,}", line) for line in str(table).splitlines()[4:-2]]
        return {name: [median, high] for name, median, high in rows}

    cpu = metrics_table(rows, gpu=False)
    # peak memory is shown wherever it was measured (it is PyTorch's, not GPU capture's)
    assert cells(cpu) == {
        "Step time": ["3.000ms", "4.000ms"],
        "Data wait": ["10.0%", "50.0%"],
        "Peak memory": ["200.0 MiB", "300.0 MiB"],
    }  # the measured steps
    assert str(cpu).endswith("over 3 recorded steps, steps 99-299\n")
    gpu = cells(metrics_table(rows, gpu=True))
    assert gpu["GPU busy"] == ["50.0%", "100.0%"] and gpu["Kernels"] == ["20", "30"]
    assert gpu["Sync wait"] == gpu["Communication"] == ["0.0%", "0.0%"]


DOCS = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "integrations.md")


@pytest.mark.parametrize(
    "example, needs",
    [(0, ("lightning",)), (1, ("transformers", "accelerate")), (2, ("accelerate",))],
)
def test_the_examples_of_docs_integrations_md_run(example, needs, tmp_path):
    """Each framework's copy-paste example, as the page shows it, in a fresh process."""
    for package in needs:
        pytest.importorskip(package, reason=f"{package} is not installed (make frameworks)")
    with open(DOCS, encoding="utf-8") as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    assert len(blocks) == 3
    # one thread per process: on a small shared machine, PyTorch's thread pool spinning on
    # tiny matrices takes most of the time
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run(
        [sys.executable, "-c", blocks[example]],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    # each printed the step metrics of its recorded steps: one in 100, from step 99
    if example == 1:  # log_history entries, logged at global steps 100 and 200
        assert "'step': 100}" in r.stdout and "'step': 200}" in r.stdout
        assert (tmp_path / "out" / "gpuprof-train.gpuprof").exists()
    else:  # rows of steps()
        assert re.search(r"\(\s*99, \d+", r.stdout) and re.search(r"\(199, \d+", r.stdout)
    if example == 2:
        assert len(list((tmp_path / "runs" / "gpuprof").iterdir())) == 2


def test_importing_gpuprof_integrations_imports_no_framework():
    code = (
        "import sys, gpuprof, gpuprof.integrations; "
        "print(sorted(m for m in ('torch', 'lightning', 'pytorch_lightning', "
        "'transformers', 'accelerate') if m in sys.modules))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "module, blocked, pip",
    [
        ("lightning", ("lightning", "pytorch_lightning"), "pip install 'lightning>=2.0'"),
        ("transformers", ("transformers",), "pip install 'transformers>=4.46'"),
        ("accelerate", ("accelerate",), "pip install 'accelerate>=0.20'"),
    ],
)
def test_a_missing_framework_is_named_with_its_install_command(module, blocked, pip):
    code = (
        f"import sys; sys.modules.update(dict.fromkeys({blocked!r})); "
        f"import gpuprof.integrations.{module}"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"ImportError: gpuprof.integrations.{module} needs {blocked[0]} >= ")
    assert pip in last
