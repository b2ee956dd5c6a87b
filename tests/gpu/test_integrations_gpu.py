"""The framework integrations on a GPU: the step metrics with their CUDA figures (GPU
busy, sync wait, communication, kernels, peak device memory) in Lightning's CSVLogger,
in Hugging Face's log history and in an accelerate tracker, CUDA columns in the
summary, and CUPTI attached again for each window where the integrations start a
profile per window (CPython < 3.12).

Marked `gpu`: skipped (with the loader's reason) where GPU capture is unusable.
"""

import csv
import glob
import gzip
import json
import os

import gpuprof
import pytest
from gpu_helpers import cuda_torch
from gpuprof.integrations import _session

pytestmark = pytest.mark.gpu
MiB = 1 << 20
SCRATCH = 64 * MiB  # each training step allocates this much more, then frees it
GPU_METRICS = {
    "gpuprof/step_time_ms",
    "gpuprof/data_wait_pct",
    "gpuprof/gpu_busy_pct",
    "gpuprof/sync_wait_pct",
    "gpuprof/comm_pct",
    "gpuprof/kernels",
    "gpuprof/peak_memory_mib",
}


@pytest.fixture(params=["per_window", "continuous"])
def mode(request, monkeypatch):
    monkeypatch.setattr(_session, "PER_WINDOW", request.param == "per_window")
    return request.param


def check_gpu_rows(steps):
    """Every recorded step ran kernels, kept the GPU busy part of the time, waited on
    the GPU (the .item() of every step) and reached the scratch allocation."""
    assert len(steps)
    assert (steps["kernels"] > 0).all(), steps
    assert ((steps["gpu_busy_ns"] > 0) & (steps["gpu_busy_ns"] <= steps["step_ns"])).all()
    assert (steps["sync_wait_ns"] > 0).all(), steps
    assert (steps["peak_memory_bytes"] >= SCRATCH).all(), steps


def test_lightning_fit_on_a_gpu_logs_the_cuda_metrics(tmp_path, mode):
    torch = cuda_torch()
    L = pytest.importorskip("lightning", reason="Lightning is not installed")
    from gpuprof.integrations.lightning import GpuprofProfiler
    from lightning.pytorch.loggers import CSVLogger

    class Regressor(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(
                torch.nn.Linear(32, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1)
            )

        def training_step(self, batch, batch_idx):
            x, y = batch
            scratch = torch.zeros(SCRATCH // 4, device=self.device)  # in the peak
            loss = torch.nn.functional.mse_loss(self.net(x), y) + 0 * scratch[0]
            self.log("loss", loss.item())  # a sync in every step
            return loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    # three windows: with a profile per window, CUPTI is attached three times
    profiler = GpuprofProfiler(schedule=gpuprof.schedule(wait=2, warmup=1, active=2))
    data = torch.utils.data.TensorDataset(torch.randn(1024, 32), torch.randn(1024, 1))
    trainer = L.Trainer(
        accelerator="gpu",
        devices=1,
        max_steps=16,
        profiler=profiler,
        logger=CSVLogger(str(tmp_path)),
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Regressor(), torch.utils.data.DataLoader(data, batch_size=32))
    steps = profiler.steps()
    assert list(steps["step"]) == [3, 4, 8, 9, 13, 14]
    check_gpu_rows(steps)
    with open(os.path.join(trainer.log_dir, "metrics.csv"), newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["gpuprof/step_time_ms"]]
    assert [int(r["step"]) for r in rows] == [3, 4, 8, 9, 13, 14]
    for r, s in zip(rows, steps):
        assert GPU_METRICS <= set(k for k, v in r.items() if v)
        assert float(r["gpuprof/kernels"]) == s["kernels"]
        assert float(r["gpuprof/gpu_busy_pct"]) == pytest.approx(
            100 * s["gpu_busy_ns"] / s["step_ns"]
        )
        assert float(r["gpuprof/peak_memory_mib"]) >= SCRATCH / MiB
        assert float(r["gpuprof/comm_pct"]) == 0.0  # one GPU: no NCCL
    text = profiler.summary()
    assert "Self CUDA" in text and "GPU busy" in text and "Peak memory" in text
    assert "Sync wait" in text and "Kernels" in text
    trace = glob.glob(os.path.join(trainer.log_dir, "fit.*.pt.trace.json.gz"))[0]
    with gzip.open(trace, "rt") as f:
        events = json.load(f)["traceEvents"]
    assert any(e.get("cat") == "kernel" for e in events)


def test_hf_trainer_on_a_gpu_logs_the_cuda_metrics(tmp_path, mode):
    torch = cuda_torch()
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    pytest.importorskip("accelerate", reason="accelerate (needed by Trainer) is not installed")
    from gpuprof.integrations.transformers import GpuprofCallback

    class Scratch(transformers.TrainerCallback):
        """Allocates SCRATCH on the device and syncs, in every step (on_step_begin)."""

        def on_step_begin(self, args, state, control, **kwargs):
            torch.zeros(SCRATCH // 4, device="cuda").sum().item()

    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=96,
        n_positions=32,
        n_embd=64,
        n_layer=2,
        n_head=2,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = transformers.GPT2LMHeadModel(config)
    data = [{"input_ids": ids, "labels": ids.clone()} for ids in torch.randint(0, 96, (256, 32))]
    cb = GpuprofCallback(schedule=gpuprof.schedule(wait=1, warmup=1, active=2))
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=8,
        max_steps=8,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=data, callbacks=[Scratch(), cb]
    )
    trainer.train()
    steps = cb.steps()
    assert list(steps["step"]) == [2, 3, 6, 7]
    check_gpu_rows(steps)
    history = [h for h in trainer.state.log_history if "gpuprof/kernels" in h]
    assert len(history) == 4
    assert all(GPU_METRICS <= set(h) for h in history)
    assert [h["gpuprof/kernels"] for h in history] == [float(k) for k in steps["kernels"]]
    assert "Self CUDA" in cb.summary()


def test_accelerate_loop_on_a_gpu_logs_the_cuda_metrics(tmp_path, mode):
    torch = cuda_torch()
    pytest.importorskip("accelerate", reason="accelerate is not installed")
    from accelerate import Accelerator
    from accelerate.tracking import GeneralTracker
    from gpuprof.integrations.accelerate import profile

    class Recorder(GeneralTracker):
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
    acc = Accelerator(log_with=[recorder])
    acc.init_trackers("run")
    model = torch.nn.Sequential(torch.nn.Linear(32, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1))
    opt = torch.optim.AdamW(model.parameters())
    data = torch.utils.data.TensorDataset(torch.randn(512, 32), torch.randn(512, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=32)
    model, opt, loader = acc.prepare(model, opt, loader)
    with profile(acc, schedule=gpuprof.schedule(wait=1, warmup=1, active=2)) as prof:
        for x, y in loader:
            scratch = torch.zeros(SCRATCH // 4, device=acc.device)
            loss = torch.nn.functional.mse_loss(model(x), y) + 0 * scratch[0]
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
            loss.item()
            del scratch
            prof.step()
    acc.end_training()
    steps = prof.steps()
    assert list(steps["step"]) == [2, 3, 6, 7, 10, 11, 14, 15]
    check_gpu_rows(steps)
    assert [s for s, _ in recorder.logged] == list(steps["step"])
    assert all(GPU_METRICS <= set(v) for _, v in recorder.logged)
