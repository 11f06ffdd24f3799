# A Lightning Trainer as its users write one: a small MLP on synthetic
# data, a ModelCheckpoint every --save-steps optimizer steps in --out, and
# the run resumed from its last checkpoint when there is one. Lightning
# reads torchrun's variables (its TorchElasticEnvironment), so it runs
# unchanged under torchrun and gotrain torchrun. For bench/real_restart.py:
# prints "resuming from last.ckpt" and "train step N" after each step.
import argparse, os

import torch
import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, Dataset

ap = argparse.ArgumentParser()
ap.add_argument("--out", default="lightning-out")
ap.add_argument("--steps", type=int, default=100000)
ap.add_argument("--save-steps", type=int, default=20)
a = ap.parse_args()


class Samples(Dataset):
    def __len__(self):
        return 1 << 20

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        x = torch.randn(256, generator=g)
        return x, x.sum().unsqueeze(0)


class Net(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1))

    def training_step(self, batch, _):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def on_train_batch_end(self, *_):
        print("train step %d" % self.global_step, flush=True)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


ckpt = ModelCheckpoint(dirpath=a.out, every_n_train_steps=a.save_steps, save_last=True)
last = os.path.join(a.out, "last.ckpt")
if os.path.exists(last):
    print("resuming from last.ckpt", flush=True)
world = int(os.environ.get("WORLD_SIZE", "1"))
trainer = L.Trainer(max_steps=a.steps, accelerator="auto", devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
                    num_nodes=max(1, world // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))),
                    strategy="ddp" if world > 1 else "auto", callbacks=[ckpt], logger=False,
                    enable_progress_bar=False, enable_model_summary=False)
trainer.fit(Net(), DataLoader(Samples(), batch_size=64, num_workers=0), ckpt_path=last if os.path.exists(last) else None)
