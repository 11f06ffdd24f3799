#!/usr/bin/env bash
# Kill -> first training step of unchanged programs on one GPU, gotrain
# torchrun against torchrun, interleaved (bench/real_restart.py):
# pytorch/examples' ddp-tutorial-series multinode.py (fetched on the
# development machine into build/ddp-tutorial-series, never committed:
#   git -C EXAMPLES show HEAD:distributed/ddp-tutorial-series/multinode.py > build/ddp-tutorial-series/multinode.py
#   (and datautils.py)), a transformers Trainer (bench/hf_trainer.py) and a
# Lightning Trainer (bench/lightning_trainer.py), each resuming from its own
# checkpoints.
#
#   go build -o bin/gotrain ./cmd/gotrain   # on the development machine
#   bash bench/real_restart_gpu.sh          # on the GPU machine
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
PY=${PY:-/opt/torch/.venv/bin/python}
RUNS=${RUNS:-3}
PROGS=${PROGS:-"ddp hf lightning"}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
"$PY" -c 'import torch, transformers, lightning; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version(), "transformers", transformers.__version__, "lightning", lightning.__version__)'
work=$(mktemp -d)
for prog in $PROGS; do
	case $prog in
	ddp)
		cp build/ddp-tutorial-series/*.py "$work/"
		echo "== pytorch/examples ddp-tutorial-series multinode.py"
		"$PY" bench/real_restart.py --runs "$RUNS" --python "$PY" --cwd "$work" --clean snapshot.pt \
			--ready 'Epoch 30 ' --resumed 'Resuming training' --step '\] Epoch [0-9]+ \|' -- multinode.py 100000 1
		;;
	hf)
		cp bench/hf_trainer.py "$work/"
		echo "== transformers Trainer (tiny GPT-2), its own checkpoints"
		"$PY" bench/real_restart.py --runs "$RUNS" --python "$PY" --cwd "$work" --clean hf-out --timeout 180 \
			--ready 'train step 45$' --resumed 'resuming from checkpoint' --step 'train step [0-9]+$' -- hf_trainer.py --save-steps 20
		;;
	lightning)
		cp bench/lightning_trainer.py "$work/"
		echo "== Lightning Trainer (an MLP), its own checkpoints"
		"$PY" bench/real_restart.py --runs "$RUNS" --python "$PY" --cwd "$work" --clean lightning-out --timeout 180 \
			--ready 'train step 45$' --resumed 'resuming from last.ckpt' --step 'train step [0-9]+$' -- lightning_trainer.py --save-steps 20
		;;
	esac
done
