# A Hugging Face transformers Trainer as its users write one: a tiny GPT-2
# from a config, synthetic tokens, checkpoints every --save-steps in
# --out, resuming from the newest one when there is one. For
# bench/real_restart.py: prints "resuming from checkpoint-N" and, from a
# callback, "train step N" after each optimizer step.
import argparse, glob, os

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

ap = argparse.ArgumentParser()
ap.add_argument("--out", default="hf-out")
ap.add_argument("--steps", type=int, default=100000)
ap.add_argument("--save-steps", type=int, default=20)
a = ap.parse_args()


class Tokens(Dataset):
    def __len__(self):
        return 1 << 20

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        ids = torch.randint(0, 1000, (64,), generator=g)
        return {"input_ids": ids, "labels": ids}


class Say(TrainerCallback):
    def on_step_end(self, args, state, control, **kw):
        print("train step %d" % state.global_step, flush=True)


model = GPT2LMHeadModel(GPT2Config(vocab_size=1000, n_positions=64, n_embd=128, n_layer=2, n_head=2))
args = TrainingArguments(output_dir=a.out, max_steps=a.steps, per_device_train_batch_size=8, save_steps=a.save_steps,
                         save_total_limit=2, logging_steps=1000, report_to=[], dataloader_num_workers=0, disable_tqdm=True)
ckpts = sorted(glob.glob(os.path.join(a.out, "checkpoint-*")), key=lambda p: int(p.rsplit("-", 1)[1]))
if ckpts:
    print("resuming from %s" % os.path.basename(ckpts[-1]), flush=True)
Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=[Say()]).train(resume_from_checkpoint=ckpts[-1] if ckpts else None)
