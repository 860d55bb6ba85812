#!/usr/bin/env bash
# Measures the dense models pdopt's experiments and real-run replay use, on the GPU of this
# machine, with the harness in this folder (random weights). Writes one profile CSV per model,
# gpu.txt and logs.txt into $1 (default: profiles/measured). Each model gets its own time limit so that one
# slow model cannot cost the others (PER_MODEL_S, default 130 s; REPEATS, default 5).
# Files are named after torch's device name (NVIDIA-H100-80GB-HBM3_Llama-3-8B_measured.csv). The
# shipped ones in profiles/measured/ were run on 2026-11-28 on an H100 and an H200 and renamed to
# <catalogue gpu>_<model>_measured.csv in lower case, with gpu.txt and logs.txt kept as
# <gpu>_gpu.txt and <gpu>_logs.txt (profiles/measured/README.md); after adding or replacing
# files there, run `python -m calibration.compare_measured` to regenerate that README's tables.
set -u
out=${1:-profiles/measured}
per_model_s=${PER_MODEL_S:-130}
mkdir -p "$out"
gpu=$(python3 -c "import torch; print(torch.cuda.get_device_name(0).replace(' ', '-'))")
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv > "$out/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" >> "$out/gpu.txt"
for model in Llama-3-8B Llama-2-7B Qwen2.5-7B CodeLlama-34B; do
    start=$(date +%s)
    timeout "$per_model_s" python3 -m calibration.profile_gpu --model "$model" --quiet \
        --repeats "${REPEATS:-5}" --warmup 2 --out "$out/${gpu}_${model}_measured.csv" \
        > "$out/last.log" 2>&1
    rc=$?
    { echo "== $model"; cat "$out/last.log"; } >> "$out/logs.txt"; rm -f "$out/last.log"
    echo "$model rc=$rc wall_s=$(( $(date +%s) - start ))" | tee -a "$out/gpu.txt"
done
