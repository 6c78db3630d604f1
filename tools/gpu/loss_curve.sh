#!/usr/bin/env bash
# Issue 7 loss-curve check, on the GPU machine from the repository root after tools/gpu/build.sh
# (carry .gpu): "on a tiny model in bf16, our per-step losses match the PyTorch script's within
# bf16 noise from the same initial adapter". Needs python3 with torch/transformers/peft (no
# network: the model is assets/tiny, the data assets/sample/tokens.jsonl). Logs go to $OUT.
#
# 1. one initial PEFT adapter (r16/alpha32 on the post's regex, B non-zero, dropout 0);
# 2. the PyTorch + PEFT reference loop from it in f32 and in bf16 (tools/reference/trainer/
#    loss_curve_ref.py; the f32-vs-bf16 difference is the reference's own bf16 noise);
# 3. our .gpu/train_ddp from it on CUDA in bf16 (and f32, as a setup check), same batches
#    (--no-shuffle), schedule, clip and optimizer;
# 4. tools/reference/trainer/compare_loss_curves.py prints the loss columns, max/mean abs
#    differences and the verdict (exit 1 on FAIL).
# Settings: STEPS (30), MICRO_BATCH (4), ACCUM (2), LR (1e-3), WARMUP (2), MODEL (assets/tiny; e.g.
# tests/golden/gemma4-c-moe for the MoE path, tests/golden/gemma4-b-ple-kvshare for per-layer
# embeddings + KV sharing: the sample token ids are then folded into the model's vocabulary),
# TAG (file-name suffix of the logs, default: the model folder's name).
set -uo pipefail
OUT="${OUT:-out/gpu}"; mkdir -p "$OUT"
STEPS="${STEPS:-30}"; MICRO_BATCH="${MICRO_BATCH:-4}"; ACCUM="${ACCUM:-2}"; LR="${LR:-1e-3}"; WARMUP="${WARMUP:-2}"
PY="${PYTHON:-python3}"
REF=tools/reference/trainer
MODEL="${MODEL:-assets/tiny}"; TAG="${TAG:-$(basename "$MODEL")}"
DATA="$OUT/lc_data_$TAG.jsonl"
$PY - "$MODEL/config.json" assets/sample/tokens.jsonl "$DATA" <<'PYEOF' || exit 1
import json, sys
cfg = json.load(open(sys.argv[1])); vocab = cfg.get("text_config", cfg)["vocab_size"]
with open(sys.argv[3], "w") as out:
    for line in open(sys.argv[2]):
        row = json.loads(line)
        row = {k: [v % vocab if v >= 0 else v for v in vals] for k, vals in row.items()}
        out.write(json.dumps(row) + "\n")
PYEOF
if [ -d .gpu ]; then
  source tools/gpu/machine_setup.sh
fi
TRAIN="${TRAIN_DDP:-.gpu/train_ddp}"
[ -x "$TRAIN" ] || { echo "missing $TRAIN (run tools/gpu/build.sh here and carry .gpu)" >&2; exit 2; }
step() { echo; echo "=== $*"; }
common=(--micro-batch "$MICRO_BATCH" --accum "$ACCUM" --max-steps "$STEPS" --lr "$LR" --warmup "$WARMUP" --epochs 1 --max-len 128)

step "initial adapter"
$PY $REF/loss_curve_ref.py --model "$MODEL" --make-init "$OUT/lc_init_adapter_$TAG" 2>&1 | grep -v -i warn | tail -3 || exit 1

for dt in f32 bf16; do
  step "reference PyTorch + PEFT, cuda $dt"
  $PY $REF/loss_curve_ref.py --model "$MODEL" --data "$DATA" --init-adapter "$OUT/lc_init_adapter_$TAG" \
    --device cuda --dtype $dt --out "$OUT/lc_ref_${dt}_$TAG.json" "${common[@]}" > "$OUT/lc_ref_${dt}_$TAG.log" 2>&1
  rc=$?; tail -3 "$OUT/lc_ref_${dt}_$TAG.log"; [ $rc -eq 0 ] || exit 1
done

for dt in f32 bf16; do
  step "ours train_ddp, cuda $dt"
  rm -rf "$OUT/lc_ours_${dt}_$TAG"
  "$TRAIN" --model "$MODEL" --data "$DATA" --output "$OUT/lc_ours_${dt}_$TAG" \
    --device cuda --dtype $dt --init-adapter "$OUT/lc_init_adapter_$TAG" --no-shuffle --log-every 1 \
    "${common[@]}" > "$OUT/lc_ours_${dt}_$TAG.log" 2>&1
  rc=$?; tail -3 "$OUT/lc_ours_${dt}_$TAG.log"; [ $rc -eq 0 ] || exit 1
done

step "compare"
$PY $REF/compare_loss_curves.py --ref-f32 "$OUT/lc_ref_f32_$TAG.json" --ref-bf16 "$OUT/lc_ref_bf16_$TAG.json" \
  --ours-bf16 "$OUT/lc_ours_bf16_$TAG/metrics.jsonl" --ours-f32 "$OUT/lc_ours_f32_$TAG/metrics.jsonl" \
  --json "$OUT/loss_curve_verdict_$TAG.json" 2>&1 | tee "$OUT/loss_curve_$TAG.txt"
exit "${PIPESTATUS[0]}"
