#!/usr/bin/env bash
# Issue 15's next device check: the recipes no GPU row covers yet, in one run of 16
# steps, each a fresh process as bench.gpu_sweep runs it; not yet timed on a GPU.
#
#   full fine-tunes   llama-3.2-1b, qwen2.5-1.5b   seq 2048  off, full, blocks:12
#   encoder families  bert-base-uncased (seq 512), t5-base (seq 1024)
#                     LoRA and full fine-tune      off, full
#   the worst T4 row  SmolLM2-1.7B QLoRA and LoRA, eager, seq 2048, full (HF's)
#
# Run from the repository root with a python3 that has torch, transformers and peft:
#   bash bench/gpu_window.sh            rows appended to $OUT/window.json (or bench/data/)
#   DRY=1 bash bench/gpu_window.sh      print the steps only (what the tests check)
# Then copy the rows into bench/data/ and run `python -m bench.gpu_truth`.
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
python=${PYTHON:-python3}
rows=${OUT:-bench/data}/window.json
dry=()
if [[ -n "${DRY:-}" ]]; then dry=(--dry); fi
failed=0

step() {
    echo "bench.gpu_step $*"
    if [[ -z "${DRY:-}" ]]; then
        timeout 180 "$python" -m bench.gpu_step "$@" || failed=$((failed + 1))
    fi
}

sweep() {
    "$python" -m bench.gpu_sweep --out "$rows" --timeout 180 "${dry[@]}" "$@" || failed=$((failed + $?))
}

# blocks:12 is a placed plan between medium and full (12 of 16 and 12 of 28 blocks),
# not HF's every_n_layers.
sweep --presets llama-3.2-1b,qwen2.5-1.5b --seqs 2048 --tiers off,full,blocks:12 --method full
for method in lora full; do
    sweep --presets bert-base-uncased --seqs 512 --tiers off,full --method "$method"
    sweep --presets t5-base --seqs 1024 --tiers off,full --method "$method"
done
# The worst shared row (SmolLM2-1.7B QLoRA eager seq 2048 on the T4: process memory
# +14.9%) in its recipe, with its LoRA twin (exact on the T4) as the control; each row
# records its pool's segments (measured.segments_mib) to set against the replay's.
# QLoRA needs bitsandbytes: carry its wheel (the device guide's .whl recipe).
if [[ -n "${DRY:-}" ]] || "$python" -c "import bitsandbytes" 2>/dev/null; then
    smol=(--model bench/data/configs/smollm2-1.7b.json --seq-len 2048 --dtype fp16
        --attention eager --tier full --hooks hf --lora-rank 32
        --lora-targets q_proj,k_proj,v_proj,o_proj --out "$rows"
        --weights "${TMPDIR:-/tmp}/ckpt-window-smollm2")
    step --method qlora "${smol[@]}"
    step --method lora --load-path to_device "${smol[@]}"
else
    echo "bitsandbytes is not installed: the QLoRA reproduction is skipped" >&2
fi
if [[ -z "${DRY:-}" ]]; then "$python" -m bench.gpu_truth --local "$(dirname "$rows")"; fi
exit $((failed > 125 ? 125 : failed))
