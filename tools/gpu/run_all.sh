#!/usr/bin/env bash
# Everything of issues 7 and 8 in one GPU-machine call (from the repository root after
# tools/gpu/build.sh, carry .gpu; the machine may have 1 or N GPUs): the CUDA checks (parity,
# layer-wise backward, ops vs CPU), then on N > 1 GPUs tools/gpu/run_nccl.sh and
# tools/gpu/run_multi.sh, then tools/gpu/run_scaling.sh (ours and the PyTorch script on 1 and N
# GPUs). Each part logs to $OUT/<part>/ and its console to $OUT/<part>.txt; $OUT/summary.txt has
# the verdict lines. Set PARTS to run a subset ("checks nccl multi scaling").
set -uo pipefail
OUT="${OUT:-out/gpu}"; mkdir -p "$OUT"
source tools/gpu/machine_setup.sh
NGPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
PARTS="${PARTS:-checks nccl multi scaling}"
has() { [[ " $PARTS " == *" $1 "* ]]; }
if has checks; then
  mkdir -p "$OUT/checks"
  {
    echo "=== parity"; G4FT_TEST_DEVICE=cuda .gpu/gemma4_parity --nocapture --test-threads 1 > "$OUT/checks/parity.log" 2>&1; echo "exit $?"
    grep -E "^test result" "$OUT/checks/parity.log"
    echo "=== layer-wise backward"; G4FT_TEST_DEVICE=cuda .gpu/gemma4_layerwise --nocapture --test-threads 1 > "$OUT/checks/layerwise.log" 2>&1; echo "exit $?"
    grep -E "^test result" "$OUT/checks/layerwise.log"
    echo "=== ops: CUDA vs CPU"; .gpu/g4ft_ops_test gpu_ --nocapture --test-threads=1 > "$OUT/checks/ops.log" 2>&1; echo "exit $?"
    grep -E "^test result|FAIL|rms_norm|rope" "$OUT/checks/ops.log"
  } > "$OUT/checks.txt" 2>&1
fi
if [ "$NGPU" -gt 1 ]; then
  has nccl && OUT="$OUT/nccl" SKIP_W1=1 bash tools/gpu/run_nccl.sh > "$OUT/nccl.txt" 2>&1
  has multi && OUT="$OUT/multi" SKIP_NCCL=1 bash tools/gpu/run_multi.sh > "$OUT/multi.txt" 2>&1
fi
has scaling && OUT="$OUT/scaling" bash tools/gpu/run_scaling.sh > "$OUT/scaling.txt" 2>&1
grep -hE "^test result|exit [1-9]|PASS|FAIL|CHECKS|hidden|SUMMARY|\| (ours|PyTorch) \|" \
  "$OUT"/checks.txt "$OUT"/nccl.txt "$OUT"/multi.txt "$OUT"/scaling.txt 2>/dev/null > "$OUT/summary.txt"
cat "$OUT/summary.txt"
