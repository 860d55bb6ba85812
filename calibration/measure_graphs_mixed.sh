#!/usr/bin/env bash
# Times the three 7-8B dense models with every forward pass captured as a CUDA graph
# (--cuda-graphs) and with the mixed-batch sweep (--mixed: B decodes + one prefill chunk in one
# pass, beside the decode-only and prefill-only passes of the same shapes), on this machine's GPU.
# Run from the repository root:   bash calibration/measure_graphs_mixed.sh "$OUT"
# Writes into $1 (default: profiles/measured_graphs) exactly these 8 files at most:
#   <gpu>_<model>_graphs.csv        the pdopt profile (gemm, prefill, decode rows), 3 models
#   <gpu>_<model>_graphs_mixed.csv  the mixed rows and fused/(decode+prefill) ratios, 3 models
#   gpu.txt                         nvidia-smi, torch/CUDA versions, per-model exit code and time
#   logs.txt                        each model's output (capture fallbacks, the mixed table)
# Each model runs under `timeout` (PER_MODEL_S, default 100 s) so one slow model cannot cost the
# others; the per-model log goes to a temporary file outside $1 and is appended to logs.txt.
set -u
out=${1:-profiles/measured_graphs}
per_model_s=${PER_MODEL_S:-100}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$out"
log=$(mktemp)
gpu=$(python3 -c "import torch; print(torch.cuda.get_device_name(0).replace(' ', '-'))")
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv > "$out/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" >> "$out/gpu.txt"
for model in Llama-3-8B Llama-2-7B Qwen2.5-7B; do
    start=$(date +%s)
    timeout "$per_model_s" python3 -m calibration.profile_gpu --model "$model" --cuda-graphs \
        --mixed --repeats 5 --warmup 2 --quiet --out "$out/${gpu}_${model}_graphs.csv" \
        > "$log" 2>&1
    rc=$?
    { echo "== $model rc=$rc"; cat "$log"; } >> "$out/logs.txt"
    echo "$model rc=$rc wall_s=$(( $(date +%s) - start ))" | tee -a "$out/gpu.txt"
done
rm -f "$log"
ls -l "$out"
