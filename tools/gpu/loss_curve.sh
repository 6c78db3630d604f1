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
# Settings: STEPS (30), MICRO_BATCH (4), ACCUM (2), LR (1e-3), WARMUP (2).
set -uo pipefail
OUT="${OUT:-out/gpu}"; mkdir -p "$OUT"
STEPS="${STEPS:-30}"; MICRO_BATCH="${MICRO_BATCH:-4}"; ACCUM="${ACCUM:-2}"; LR="${LR:-1e-3}"; WARMUP="${WARMUP:-2}"
PY="${PYTHON:-python3}"
REF=tools/reference/trainer
if [ -d .gpu ]; then
  (cd .gpu && for f in *.xz; do [ -e "$f" ] && xz -dkf "$f"; done; chmod +x ./* 2>/dev/null)
  [ -f .gpu/device-env.sh ] && source .gpu/device-env.sh
fi
TRAIN="${TRAIN_DDP:-.gpu/train_ddp}"
[ -x "$TRAIN" ] || { echo "missing $TRAIN (run tools/gpu/build.sh here and carry .gpu)" >&2; exit 2; }
step() { echo; echo "=== $*"; }
common=(--micro-batch "$MICRO_BATCH" --accum "$ACCUM" --max-steps "$STEPS" --lr "$LR" --warmup "$WARMUP" --epochs 1 --max-len 128)

step "initial adapter"
$PY $REF/loss_curve_ref.py --make-init "$OUT/lc_init_adapter" 2>&1 | grep -v -i warn | tail -3 || exit 1

for dt in f32 bf16; do
  step "reference PyTorch + PEFT, cuda $dt"
  $PY $REF/loss_curve_ref.py --init-adapter "$OUT/lc_init_adapter" --device cuda --dtype $dt \
    --out "$OUT/lc_ref_$dt.json" "${common[@]}" > "$OUT/lc_ref_$dt.log" 2>&1
  rc=$?; tail -3 "$OUT/lc_ref_$dt.log"; [ $rc -eq 0 ] || exit 1
done

for dt in f32 bf16; do
  step "ours train_ddp, cuda $dt"
  rm -rf "$OUT/lc_ours_$dt"
  "$TRAIN" --model assets/tiny --data assets/sample/tokens.jsonl --output "$OUT/lc_ours_$dt" \
    --device cuda --dtype $dt --init-adapter "$OUT/lc_init_adapter" --no-shuffle --log-every 1 \
    "${common[@]}" > "$OUT/lc_ours_$dt.log" 2>&1
  rc=$?; tail -3 "$OUT/lc_ours_$dt.log"; [ $rc -eq 0 ] || exit 1
done

step "compare"
$PY $REF/compare_loss_curves.py --ref-f32 "$OUT/lc_ref_f32.json" --ref-bf16 "$OUT/lc_ref_bf16.json" \
  --ours-bf16 "$OUT/lc_ours_bf16/metrics.jsonl" --ours-f32 "$OUT/lc_ours_f32/metrics.jsonl" \
  --json "$OUT/loss_curve_verdict.json" 2>&1 | tee "$OUT/loss_curve.txt"
exit "${PIPESTATUS[0]}"
