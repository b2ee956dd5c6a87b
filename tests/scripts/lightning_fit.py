"""A Lightning ``Trainer.fit()`` script, written with no thought of gpuprof.

    python lightning_fit.py [--accelerator cpu|gpu] [--max-steps N] [--accumulate K]

``max_steps`` counts optimizer steps, so the run makes exactly N of them (each
over K batches when K > 1).
"""

import argparse

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset


class Regressor(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1)
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--accelerator", default="cpu")
    p.add_argument("--max-steps", type=int, default=8)
    p.add_argument("--accumulate", type=int, default=1)
    a = p.parse_args()
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(1024, 32), torch.randn(1024, 1))
    trainer = L.Trainer(
        accelerator=a.accelerator,
        devices=1,
        max_steps=a.max_steps,
        accumulate_grad_batches=a.accumulate,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Regressor(), DataLoader(data, batch_size=16))
    print(f"fit done: {trainer.global_step} optimizer steps")


if __name__ == "__main__":
    main()
