#!/usr/bin/env bash
# Issue 15's next device check: the recipes no GPU row covers yet, in one run of 14
# steps, each a fresh process as bench.gpu_sweep runs it; not yet timed on a GPU.
#
#   full fine-tunes   llama-3.2-1b, qwen2.5-1.5b   seq 2048  off, full, blocks:12
#   encoder families  bert-base-uncased (seq 512), t5-base (seq 1024)
#                     LoRA and full fine-tune      off, full
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
if [[ -z "${DRY:-}" ]]; then "$python" -m bench.gpu_truth --local "$(dirname "$rows")"; fi
exit $((failed > 125 ? 125 : failed))
