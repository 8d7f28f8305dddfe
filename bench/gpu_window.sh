#!/usr/bin/env bash
# The GPU window: one command that turns a lent GPU machine's minutes (at most 9 of them) into the evidence the CPU
# cannot give. Whoever gets a GPU runs exactly this, from the repository root, and commits the JSONs it writes.
#
#   bench/gpu_window.sh [CIFAR_PARQUET_FOLDER]     # on the GPU machine; default $ROPIM_BENCH_CIFAR or .gpu_data/cifar10
#   bench/gpu_window.sh --tiny                     # every part on CPU in about a minute (CI runs this)
#   ROPIM_BENCH_SEED=2 bench/gpu_window.sh         # part 1 with another seed (default 0)
#   ROPIM_BENCH_PRETRAIN_EPOCHS=30                 # part 1's pretraining length (default 30; empty: equal seconds)
#   ROPIM_BENCH_FINETUNE_EPOCHS=7                  # part 1's fine-tune length (default 7; empty: as time allows)
#
# Parts, each under its own time cap so that one stuck part cannot eat the others' minutes:
#   1. bench/gpu_evidence.py   ROPIM vs SimMIM vs no pretraining on CIFAR-10, equal budgets      (5 min, cap 320 s)
#   2. bench/preset_smoke.py   every paper preset for 2 steps at its real per-GPU batch          (cap 90 s)
#   3. bench/gpu_step.py       ViT-B/16 step: rop / mask / none, fp32 and bf16                   (cap 60 s)
#   4. bench/gpu_step.py       ViT-B/16 rop step with every option (torch.compile included)      (cap 100 s)
# Results go to $OUT when set (the device tool's folder that comes back), else bench/results/, with the log beside
# them. On an H200 (2026-11-26) the whole window took 415 s. Packages the GPU image lacks or has at other versions
# travel as wheels in .whl/ (installed into /tmp/site).
set -uo pipefail
cd "$(dirname "$0")/.."
tiny=0
if [ "${1:-}" = "--tiny" ]; then tiny=1; shift; fi
data=${1:-${ROPIM_BENCH_CIFAR:-.gpu_data/cifar10}}
results=${OUT:-bench/results}
py=${PYTHON:-python3}
seed=${ROPIM_BENCH_SEED:-0}
pretrain_epochs=${ROPIM_BENCH_PRETRAIN_EPOCHS-30}  # 30 + 7 fit the slowest host so far (an H100: 247 s of 258)
finetune_epochs=${ROPIM_BENCH_FINETUNE_EPOCHS-7}
mkdir -p "$results"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
exec > >(tee "$results/gpu_window.log") 2>&1

if compgen -G ".whl/*.whl" >/dev/null; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH="/tmp/site:$PYTHONPATH"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,temperature.gpu --format=csv 2>/dev/null || true
"$py" -c "import torch, timm; print('torch', torch.__version__, 'timm', timm.__version__, 'cuda', torch.cuda.is_available())"

failed=0
part() {  # part CAP_SECONDS COMMAND...: run under a time cap, note a failure, go on
    local cap=$1 start=$SECONDS rc=0
    shift
    echo "== $* (cap ${cap} s)"
    timeout --signal=INT --kill-after=5 "$cap" "$@" || rc=$?
    echo "== rc $rc after $((SECONDS - start)) s: $1 $2"
    [ "$rc" -eq 0 ] || failed=$((failed + 1))
}

if [ "$tiny" -eq 1 ]; then
    part 300 "$py" bench/gpu_evidence.py --tiny --minutes 0.3 --pretrain-epochs 1 --finetune-epochs 1 --out "$results/gpu_evidence.json"
    part 300 "$py" bench/preset_smoke.py --tiny --presets pretrain/vit_tiny_in100 finetune/vit_tiny \
        graft/vit_base_in1k segment/ade20k_upernet_vit_base --out "$results/preset_smoke.json"
    part 300 "$py" bench/gpu_step.py --tiny --backbones beit --options bf16 fused --out "$results/gpu_step.json"
else
    part 320 "$py" bench/gpu_evidence.py --data "$data" --minutes 5 --seed "$seed" \
        ${pretrain_epochs:+--pretrain-epochs "$pretrain_epochs"} ${finetune_epochs:+--finetune-epochs "$finetune_epochs"} \
        --out "$results/gpu_evidence.json"
    part 90 "$py" bench/preset_smoke.py --out "$results/preset_smoke.json"
    part 60 "$py" bench/gpu_step.py --models vit_b --backbones beit --corruptions rop mask none \
        --options bf16 --batch-size 128 --steps 10 --warmup 3 --out "$results/gpu_step.json"
    part 100 "$py" bench/gpu_step.py --models vit_b --backbones beit --corruptions rop --options bf16 all \
        --batch-size 128 --steps 10 --warmup 3 --out "$results/gpu_step_compile.json"
fi
echo "== gpu_window: $failed part(s) failed; results in $results"
exit $((failed > 0))
