"""Train a Hugging Face GPT-2 (the 124M configuration, random weights) with AdamW and
bf16 autocast, and diagnose it.

At batch 8 of 128 tokens the GPU finishes each kernel faster than Python launches the
next one: the diagnosis reports a launch-bound step. Either fix makes that go:

    python examples/gpt2_train.py                          # batch 8: launch-bound
    python examples/gpt2_train.py --batch 64 --seq 512     # 32x the work per launch
    python examples/gpt2_train.py --compile reduce-overhead  # Inductor + CUDA graphs

and `--shapes` adds ATen rows with input shapes, FLOPs and MFU (docs/flops.md).

docs/diagnosis.md shows what each printed on an H200.
"""

import argparse
import time

import gpuprof
import torch
from _common import report
from transformers import GPT2Config, GPT2LMHeadModel


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128, help="tokens per sample")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--layers", type=int, default=12, help="transformer blocks (GPT-2: 12)")
    p.add_argument("--compile", choices=["none", "default", "reduce-overhead"], default="none",
                   help="torch.compile mode for the model")
    p.add_argument("--shapes", action="store_true",
                   help="ATen rows with input shapes, FLOPs and MFU (record_shapes, with_flops)")
    p.add_argument("--save", help="write the profile here (.gpuprof)")
    return p.parse_args()


def main():
    a = parse_args()
    torch.manual_seed(0)
    config = GPT2Config(n_layer=a.layers)
    model = GPT2LMHeadModel(config).cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    forward = model if a.compile == "none" else torch.compile(model, mode=a.compile)

    def batch():
        ids = torch.randint(0, config.vocab_size, (a.batch, a.seq), device="cuda")
        return ids, ids

    def train_step(ids, labels):
        if a.compile == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = forward(input_ids=ids, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    started = time.perf_counter()
    for _ in range(3):  # compile, autotune and record the CUDA graphs before profiling
        train_step(*batch())
    torch.cuda.synchronize()
    print(f"warm-up (compile: {a.compile}) took {time.perf_counter() - started:.1f} s")

    started = time.perf_counter()
    losses = []
    sched = gpuprof.schedule(wait=1, warmup=2, active=a.steps - 3, repeat=1)
    with gpuprof.profile(schedule=sched, record_shapes=a.shapes, with_flops=a.shapes) as prof:
        for _ in range(a.steps):
            losses.append(train_step(*batch()))
            prof.step()
    print(f"loss {torch.stack(losses).mean().item():.3f}")

    report(prof, a.batch * a.seq, started, a.save, unit="tokens", row_limit=10)
    if a.shapes:  # the same ops, one row per input shape
        print(prof.key_averages(group_by_input_shape=True).table(
            sort_by="self_cuda_time_total", row_limit=10, max_shapes_column_width=40))


if __name__ == "__main__":
    main()
