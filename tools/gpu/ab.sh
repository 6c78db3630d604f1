#!/usr/bin/env bash
# A/B of two bench_train builds in one GPU call, from the repository root after tools/gpu/build.sh
# (carry .gpu): for each named setting, ROUNDS rounds that run A and B back to back, A first in even
# rounds and B first in odd ones (so a drift of the card's clocks over the call favours neither),
# then tools/gpu/ab_table.py: tokens/s of each run, the mean ratio, peak and predicted GB, and
# whether the runs logged the same losses at every step (if not: whether a build's own runs differ,
# i.e. it does not repeat itself, or only the two builds do).
#   A=.gpu/bench_train B=.gpu/bench_train_base ROUNDS=2 bash tools/gpu/ab.sh \
#     none_m1 "--micro-batch 1 --accum 8 --recompute none" \
#     offload_m2 "--micro-batch 2 --accum 4 --recompute all --offload-checkpoints"
# B is usually the build of the commit before the change: `bash tools/gpu/build_base.sh REV`
# writes it as .gpu/bench_train_base.xz.
# Every run gets --config CFG (the 12B's) --device DEVICE (cuda) --dtype DTYPE (bf16) --seq SEQ
# (2048) --steps STEPS (4) --warmup-discard 1 and, on CUDA, the measured matmul ceiling as
# --peak-tflops; a setting's arguments come after these and may override them. Logs go to
# $OUT/ab_<setting>_<a|b>_<round>.log; TIMEOUT_S (300) limits each run. DEVICE=cpu runs on the
# CPU without the GPU machine's setup, e.g. CFG=assets/tiny/config.json DTYPE=f32 SEQ=64.
set -uo pipefail
[ $# -ge 2 ] && [ $(( $# % 2 )) = 0 ] || { echo "usage: bash tools/gpu/ab.sh SETTING \"ARGS\" [SETTING \"ARGS\" ...]" >&2; exit 2; }
OUT="${OUT:-out/gpu}"; mkdir -p "$OUT"
A="${A:-.gpu/bench_train}"; B="${B:-.gpu/bench_train_base}"
DEVICE="${DEVICE:-cuda}"
[ "$DEVICE" = cuda ] && source tools/gpu/machine_setup.sh
for bin in "$A" "$B"; do [ -x "$bin" ] || { echo "ab.sh: missing $bin" >&2; exit 2; }; done
peak=()
if [ "$DEVICE" = cuda ]; then measure_peak_tflops; peak=(--peak-tflops "$P"); fi
common=(--config "${CFG:-crates/gemma4/tests/configs/gemma-4-12B-it.json}" --device "$DEVICE"
  --dtype "${DTYPE:-bf16}" --seq "${SEQ:-2048}" --steps "${STEPS:-4}" --warmup-discard 1 "${peak[@]}")
# run SETTING a|b ROUND ARGS: one run, its summary line on stdout.
run() {
  local log="$OUT/ab_$1_$2_$3.log" bin=$A
  [ "$2" = b ] && bin=$B
  # shellcheck disable=SC2086 # a setting's arguments are words
  timeout "${TIMEOUT_S:-300}" "$bin" "${common[@]}" $4 > "$log" 2>&1
  echo "$1 $2 round $3: exit $?$(grep -E '^SUMMARY' "$log" | grep -oE ' (tokens_per_s|peak_gb)=[^ ]+' | tr -d '\n')"
}
for (( round = 0; round < ${ROUNDS:-2}; round++ )); do
  order="a b"; [ $(( round % 2 )) = 1 ] && order="b a"
  for (( i = 1; i < $#; i += 2 )); do
    name=${!i}; j=$(( i + 1 )); args=${!j}
    for side in $order; do run "$name" "$side" "$round" "$args"; done
  done
done
python3 tools/gpu/ab_table.py "$OUT"
