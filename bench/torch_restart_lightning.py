# A PyTorch Lightning program for bench/torch_restart.sh (PROG=..., PRELOAD=
# lightning): the same method as torch_restart.py. On the first attempt the
# last rank writes the time and exits 1 once it has trained --crash-after
# seconds; on the next attempt each rank prints the time from that crash to
# the end of its first training step (DDP's first gradient all-reduce
# included) and stops. Lightning finds the launcher's torchrun variables
# (TorchElasticEnvironment) and starts no processes of its own.
import sys
import time

WARM = "lightning" in sys.modules

import argparse
import os

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--mark", required=True)
p.add_argument("--crash-after", type=float, default=15.0)
p.add_argument("--backend", default="nccl")
a = p.parse_args()
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1))
        self.t0 = None

    def training_step(self, batch, i):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def on_train_batch_end(self, out, batch, i):
        now = time.time()
        if self.t0 is None:
            self.t0 = now
        if attempt == 0:
            if self.global_rank == self.trainer.world_size - 1 and now - self.t0 > a.crash_after:
                with open(a.mark + ".tmp", "w") as f:
                    f.write(repr(now))
                os.rename(a.mark + ".tmp", a.mark)
                os._exit(1)
            return
        t = now - float(open(a.mark).read())
        print(f"RESTART rank={self.global_rank} attempt={attempt} recovered_in={t:.3f} warm={WARM}", flush=True)
        self.trainer.should_stop = True


if __name__ == "__main__":
    data = TensorDataset(torch.randn(8192, 256), torch.randn(8192, 1))
    accel = "cuda" if a.backend == "nccl" else "cpu"
    trainer = L.Trainer(accelerator=accel, devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
                        num_nodes=int(os.environ.get("GROUP_WORLD_SIZE", "1")), strategy="ddp", max_epochs=-1,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(Model(), DataLoader(data, batch_size=64))
