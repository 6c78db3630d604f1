#!/usr/bin/env bash
# NCCL checks on the GPU machine, run from the repository root after tools/gpu/build.sh (carry .gpu):
#  1. ddp_test_worker nccl: all_reduce (sum, avg) / broadcast / all_gather / barrier on CUDA tensors
#     through NCCL, many sizes and dtypes (f32 f64 bf16 f16 u8 u32 i64), plus a DDP bucket/no_sync
#     round; world size 1 with the forced one-rank communicator (plain, under ddprun, under the real
#     torchrun), then one process per GPU when the machine has several.
#  2. benches/allreduce_overlap (NCCL mode): after backward vs overlap, fraction of communication
#     hidden; world size 1 (forced one-rank communicator), then one process per GPU.
# Logs go to $OUT (the device tool's output folder) or ./out/gpu. Exits non-zero if a check failed.
# SKIP_W1=1 leaves out the world-1 runs (done on one-GPU machines) when the machine has several GPUs.
set -uo pipefail
OUT="${OUT:-out/gpu}"; mkdir -p "$OUT"
source tools/gpu/machine_setup.sh
export CRITERION_HOME="${CRITERION_HOME:-/tmp/g4ft-criterion}"
NGPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
fail=0
step() { echo; echo "=== $*"; }
# run NAME CMD...: runs CMD with a time limit, log in $OUT/NAME.log, tail on stdout, records failure.
run() {
  local name=$1; shift
  timeout "${STEP_TIMEOUT_S:-300}" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  tail -n "${TAIL:-6}" "$OUT/$name.log"
  [ $rc -eq 0 ] || { echo "!!! $name failed (exit $rc), see $OUT/$name.log"; fail=1; }
}
step gpu; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
W1=1; [ "${SKIP_W1:-0}" = 1 ] && [ "$NGPU" -gt 1 ] && W1=0
if [ $W1 = 1 ]; then
  step "nccl collectives, world 1, forced one-rank NCCL (NCCL_DEBUG=INFO: proves NCCL ran)"
  NCCL_DEBUG=INFO run nccl_w1_debug .gpu/ddp_test_worker nccl
  grep -E "NCCL INFO (cudaDriverVersion|NCCL version|comm 0x|Init COMPLETE)" "$OUT/nccl_w1_debug.log" | head -5
  grep -E "^(counts|ddp buckets)" "$OUT/nccl_w1_debug.log"
  step "nccl collectives, world 1, under ddprun"
  run nccl_w1_ddprun .gpu/ddprun --standalone --nproc-per-node 1 -- .gpu/ddp_test_worker nccl
  step "nccl collectives, world 1, under torchrun (agent store)"
  run nccl_w1_torchrun torchrun --standalone --nproc_per_node=1 --no-python .gpu/ddp_test_worker nccl
fi
if [ "$NGPU" -gt 1 ]; then
  step "nccl collectives, world $NGPU, one process per GPU (ddprun)"
  TAIL=$((2 * NGPU + 2)) run "nccl_w${NGPU}_ddprun" .gpu/ddprun --standalone --nproc-per-node "$NGPU" -- .gpu/ddp_test_worker nccl
  step "nccl collectives, world $NGPU, one process per GPU (torchrun)"
  TAIL=$((2 * NGPU + 2)) run "nccl_w${NGPU}_torchrun" torchrun --standalone --nproc_per_node="$NGPU" --no-python .gpu/ddp_test_worker nccl
else
  echo; echo "(one GPU: the N-process runs are skipped; NCCL refuses two ranks on one GPU)"
fi
if [ $W1 = 1 ]; then
  step "allreduce overlap bench, NCCL, world 1 (forced one-rank communicator)"
  TAIL=30 run bench_nccl_w1 .gpu/allreduce_overlap --bench
fi
if [ "$NGPU" -gt 1 ]; then
  step "allreduce overlap bench, NCCL, world $NGPU (one process per GPU)"
  TAIL=30 run "bench_nccl_w${NGPU}" .gpu/ddprun --standalone --nproc-per-node "$NGPU" -- .gpu/allreduce_overlap --bench
fi
echo; [ $fail -eq 0 ] && echo "ALL NCCL CHECKS PASSED" || echo "SOME NCCL CHECKS FAILED"
exit $fail
