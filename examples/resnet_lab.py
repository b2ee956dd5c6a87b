"""The classic slow-training lab: torchvision's ResNet-18 trained in FP32 on images that
PIL decodes and resizes in the Dataset's __getitem__, with DataLoader(num_workers=0) and
the loss read with .item() every step. gpuprof should find all three problems:

    python examples/resnet_lab.py            # data stall, host sync, FP32 convolutions
    python examples/resnet_lab.py --fixed    # bf16 autocast, 8 loader workers, no .item()

The images are synthetic (random pixels saved as PNG in memory), so the lab needs no
download; decoding and resizing them costs what it costs for real photos of that size.
docs/diagnosis.md shows what both printed on an H200.
"""

import argparse
import io
import time

import gpuprof
import numpy as np
import torch
import torchvision
from _common import report
from PIL import Image


class Photos(torch.utils.data.Dataset):
    """PNG-encoded 256x256 photos, decoded, resized to 224x224 and normalized per item."""

    MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
    STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)

    def __init__(self, n: int, classes: int = 100):
        rng = np.random.default_rng(0)
        self.files = []
        for _ in range(min(n, 64)):  # 64 distinct files, reused: encoding is not the lab
            buf = io.BytesIO()
            pixels = rng.integers(0, 256, (256, 256, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(buf, format="PNG")
            self.files.append(buf.getvalue())
        self.labels = rng.integers(0, classes, n)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        img = Image.open(io.BytesIO(self.files[i % len(self.files)])).convert("RGB")
        img = img.resize((224, 224), Image.BILINEAR)
        x = (np.asarray(img, dtype=np.float32) / 255.0 - self.MEAN) / self.STD
        return torch.from_numpy(x.transpose(2, 0, 1).copy()), int(self.labels[i])


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--fixed", action="store_true",
                   help="bf16 autocast, 8 loader workers with pinned memory, no per-step .item()")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--save", help="write the profile here (.gpuprof)")
    return p.parse_args()


def main():
    a = parse_args()
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=100).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    data = Photos(a.batch * (a.steps + 4))
    if a.fixed:
        loader = torch.utils.data.DataLoader(data, batch_size=a.batch, shuffle=True,
                                             num_workers=8, pin_memory=True,
                                             persistent_workers=True, prefetch_factor=4)
    else:
        loader = torch.utils.data.DataLoader(data, batch_size=a.batch, shuffle=True)

    started = time.perf_counter()
    running = torch.zeros((), device="cuda")
    sched = gpuprof.schedule(wait=1, warmup=2, active=a.steps - 3, repeat=1)
    with gpuprof.profile(schedule=sched) as prof:
        for step, (images, labels) in enumerate(loader):
            images = images.cuda(non_blocking=a.fixed)
            labels = labels.cuda(non_blocking=a.fixed)
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=a.fixed):
                loss = torch.nn.functional.cross_entropy(model(images), labels)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if a.fixed:
                running += loss.detach()
            else:
                print(f"step {step} loss {loss.item():.3f}", end="\r")
            prof.step()
            if step + 1 >= a.steps:
                break
    print(f"\nmean loss {running.item() / a.steps:.3f}" if a.fixed else "")

    report(prof, a.batch, started, a.save, unit="images", row_limit=10)


if __name__ == "__main__":
    main()
