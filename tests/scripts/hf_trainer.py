"""A Hugging Face ``Trainer`` run, written with no thought of gpuprof.

    python hf_trainer.py [MAX_STEPS] [ACCUMULATE]

A one-layer GPT-2 built from a config (nothing is downloaded) is trained on
random tokens on the CPU for MAX_STEPS optimizer steps, each over ACCUMULATE
batches.
"""

import sys
import tempfile

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments


def main(max_steps=8, accumulate=1):
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=96,
        n_positions=32,
        n_embd=32,
        n_layer=1,
        n_head=2,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = GPT2LMHeadModel(config)
    data = []
    for _ in range(256):
        ids = torch.randint(0, config.vocab_size, (16,))
        data.append({"input_ids": ids, "labels": ids.clone()})
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(
            output_dir=out,
            per_device_train_batch_size=4,
            max_steps=max_steps,
            gradient_accumulation_steps=accumulate,
            learning_rate=1e-3,
            use_cpu=True,
            report_to=[],
            save_strategy="no",
            logging_strategy="no",
            disable_tqdm=True,
            dataloader_num_workers=0,
        )
        trainer = Trainer(model=model, args=args, train_dataset=data)
        trainer.train()
    print(f"train done: {trainer.state.global_step} optimizer steps")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 8, int(sys.argv[2]) if len(sys.argv) > 2 else 1)
