# One rank of a multi-node torchrun line: joins torch.distributed (gloo),
# all-reduces its rank + 1, and writes torchrun's variables, the sum and its
# host into OUT_DIR/rank-RANK.json.
import json
import os
import socket
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
        "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS"]
out = {k: os.environ.get(k) for k in keys}
out.update(sum=t.item(), host=socket.gethostname(), python=sys.executable)
with open(os.path.join(sys.argv[1], "rank-%s.json" % os.environ["RANK"]), "w") as f:
    json.dump(out, f)
dist.destroy_process_group()
