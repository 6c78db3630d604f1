#!/usr/bin/env bash
# Issue 8 correctness and launch paths on a machine with N >= 2 GPUs, from the repository root
# after tools/gpu/build.sh (carry .gpu). Logs go to $OUT. Every training run is train_ddp on the
# tiny Gemma-4-shaped model (assets/tiny) with the bundled data, no shuffle, token-weighted loss,
# LoRA dropout 0 and the committed initial adapter, so that runs of different layouts must agree.
#  1. topology (nvidia-smi topo -m) and tools/gpu/run_nccl.sh (NCCL collectives + DDP rounds with
#     N processes under ddprun and torchrun, the all-reduce overlap bench at world N);
#  2. trajectory: N GPUs x micro-batch B against 1 GPU x micro-batch N*B, bf16 and f32; the bf16
#     tolerance is the bf16 noise of the 1-GPU run (its distance to the f32 run); every run
#     prints the cross-rank adapter checksum (DDP::check_parameters) at the end;
#  3. the same N-GPU bf16 run under the real torchrun --no-python (same binary);
#  4. two nodes emulated on this host: two ddprun launchers (--nnodes 2, N/2 GPUs each through
#     CUDA_VISIBLE_DEVICES, one rendezvous endpoint on loopback), compared with the one-launcher run;
#  5. a worker of node 1 killed (SIGKILL) mid-run: both launchers must exit non-zero, promptly;
#  6. --max-restarts 1 on one launcher: a worker killed once, the job resumes from the last
#     checkpoint and ends with the same losses as the uninterrupted run.
# Settings: STEPS (120), MICRO_BATCH (2 per GPU), ACCUM (2), LR (1e-4, the post's), SKIP_NCCL=1 skips part 1's checks.
# A dry run of the script's logic on the CPU (parts 2-6, torchrun needs python's torch):
#   DEVICE=cpu NGPU=2 SKIP_NCCL=1 TRAIN=target/release/examples/train_ddp LAUNCH=target/release/ddprun \
#     bash tools/gpu/run_multi.sh
set -uo pipefail
OUT="${OUT:-out/gpu}"; mkdir -p "$OUT"
if [ "${DEVICE:-cuda}" = cuda ] && [ -d .gpu ]; then
  source tools/gpu/machine_setup.sh
fi
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
NGPU="${NGPU:-$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)}"
[ "$NGPU" -ge 2 ] || { echo "needs >= 2 GPUs (found $NGPU)"; exit 2; }
STEPS="${STEPS:-120}"; B="${MICRO_BATCH:-2}"; ACCUM="${ACCUM:-2}"; DEVICE="${DEVICE:-cuda}"; LR="${LR:-1e-4}"
# Checkpoints every 20 steps; the kill tests strike after the one at ~1/3 and ~1/2 of the run.
KILL_A=$(( STEPS / 3 / 20 * 20 )); [ $KILL_A -lt 20 ] && KILL_A=20
KILL_B=$(( STEPS / 2 / 20 * 20 )); [ $KILL_B -lt 20 ] && KILL_B=20
TRAIN="${TRAIN:-.gpu/train_ddp}"; LAUNCH="${LAUNCH:-.gpu/ddprun}"; CMP="python3 tools/gpu/compare_runs.py"
fail=0
step() { echo; echo "=== $*"; }
check() { [ "$1" -eq 0 ] || { echo "!!! $2 failed (exit $1)"; fail=1; }; }
# train NAME DTYPE MICRO_BATCH [extra args...]: train_ddp arguments of one run (output $OUT/NAME).
train_args() {
  local name=$1 dt=$2 mb=$3; shift 3
  echo --model assets/tiny --data assets/sample/tokens.jsonl --output "$OUT/$name" --device "$DEVICE" \
    --dtype "$dt" --init-adapter tools/reference/trainer/fixtures/train/init_adapter --no-shuffle \
    --token-weighted-loss --lora-dropout 0 --micro-batch "$mb" --accum "$ACCUM" --max-steps "$STEPS" \
    --epochs 10 --lr "$LR" --warmup 2 --max-len 128 --log-every 1 --save-every 20 "$@"
}
# launch NAME WORLD DTYPE MICRO_BATCH: one ddprun launcher with WORLD workers, log $OUT/NAME.log.
launch() {
  local name=$1 world=$2 dt=$3 mb=$4
  rm -rf "${OUT:?}/$name"
  # shellcheck disable=SC2046
  timeout 300 $LAUNCH --standalone --nproc-per-node "$world" -- $TRAIN $(train_args "$name" "$dt" "$mb") \
    > "$OUT/$name.log" 2>&1
  local rc=$?
  grep -E "adapter identical|steady state" "$OUT/$name.log" | head -2
  check $rc "$name"
}
# worker_pid RANK: pid of the train_ddp worker with that global rank.
worker_pid() {
  for p in $(pgrep -f "$TRAIN --model"); do
    tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "RANK=$1" && { echo "$p"; return; }
  done
}
# wait_for PATH: until a checkpoint directory exists (at most 120 s).
wait_for() { for _ in $(seq 1200); do [ -e "$1" ] && return 0; sleep 0.1; done; return 1; }

step "topology"; nvidia-smi topo -m 2>&1 | tee "$OUT/topo.txt"
if [ "${SKIP_NCCL:-0}" != 1 ]; then
  step "NCCL checks (tools/gpu/run_nccl.sh)"
  SKIP_W1=1 bash tools/gpu/run_nccl.sh; check $? run_nccl
fi

step "trajectory: $NGPU GPUs x micro-batch $B vs 1 GPU x micro-batch $((NGPU * B)), $STEPS steps"
for dt in f32 bf16; do
  launch "tr_w${NGPU}_$dt" "$NGPU" $dt "$B"
  launch "tr_w1_$dt" 1 $dt $((NGPU * B))
done
$CMP 1gpu-bf16 "$OUT/tr_w1_bf16/metrics.jsonl" 1gpu-f32 "$OUT/tr_w1_f32/metrics.jsonl" > "$OUT/cmp_noise.txt"
NOISE=$(sed -n 's/^MAX_ABS_LOSS_DIFF \([^ ]*\).*/\1/p' "$OUT/cmp_noise.txt")
echo "bf16 noise (1 GPU, bf16 vs f32): max |loss diff| $NOISE"
$CMP "${NGPU}gpu-f32" "$OUT/tr_w${NGPU}_f32/metrics.jsonl" 1gpu-f32 "$OUT/tr_w1_f32/metrics.jsonl" --tol 1e-3 \
  > "$OUT/cmp_f32.txt"; check $? "trajectory f32"; tail -1 "$OUT/cmp_f32.txt"
$CMP "${NGPU}gpu-bf16" "$OUT/tr_w${NGPU}_bf16/metrics.jsonl" 1gpu-bf16 "$OUT/tr_w1_bf16/metrics.jsonl" --tol "$NOISE" \
  > "$OUT/cmp_bf16.txt"; check $? "trajectory bf16"; tail -1 "$OUT/cmp_bf16.txt"

step "torchrun --no-python, $NGPU GPUs, same binary"
rm -rf "$OUT/torchrun_w$NGPU"
# shellcheck disable=SC2046
timeout 300 torchrun --standalone --nproc_per_node="$NGPU" --no-python $TRAIN \
  $(train_args "torchrun_w$NGPU" bf16 "$B") > "$OUT/torchrun_w$NGPU.log" 2>&1
check $? "torchrun"; grep -E "adapter identical" "$OUT/torchrun_w$NGPU.log"
$CMP torchrun "$OUT/torchrun_w$NGPU/metrics.jsonl" ddprun "$OUT/tr_w${NGPU}_bf16/metrics.jsonl" --tol 1e-6 \
  > "$OUT/cmp_torchrun.txt"; check $? "torchrun vs ddprun"; tail -1 "$OUT/cmp_torchrun.txt"

HALF=$((NGPU / 2))
GPUS0=$(seq -s, 0 $((HALF - 1))); GPUS1=$(seq -s, "$HALF" $((NGPU - 1)))
# two_nodes NAME PORT [extra train args]: two launchers in the background, pids in P0 P1.
two_nodes() {
  local name=$1 port=$2; shift 2
  rm -rf "${OUT:?}/$name"
  for node in 0 1; do
    local gpus=$GPUS0; [ $node = 1 ] && gpus=$GPUS1
    # shellcheck disable=SC2046
    CUDA_VISIBLE_DEVICES=$gpus timeout 300 $LAUNCH --nnodes 2 --node-rank $node --nproc-per-node "$HALF" \
      --rdzv-endpoint "127.0.0.1:$port" --rdzv-id "$name" -- $TRAIN $(train_args "$name" bf16 "$B" "$@") \
      > "$OUT/${name}_node$node.log" 2>&1 &
    eval "P$node=$!"
  done
}
step "two emulated nodes (GPUs $GPUS0 | $GPUS1), rendezvous on 127.0.0.1"
two_nodes nodes2 29531
wait "$P0"; r0=$?; wait "$P1"; r1=$?
check $r0 "node 0"; check $r1 "node 1"; grep -E "adapter identical" "$OUT/nodes2_node0.log"
$CMP two-nodes "$OUT/nodes2/metrics.jsonl" one-launcher "$OUT/tr_w${NGPU}_bf16/metrics.jsonl" --tol 1e-6 \
  > "$OUT/cmp_nodes.txt"; check $? "two nodes vs one launcher"; tail -1 "$OUT/cmp_nodes.txt"

step "worker of node 1 (rank $((NGPU - 1))) killed mid-run: both launchers must stop with an error"
two_nodes kill 29532
wait_for "$OUT/kill/step-$KILL_A"; victim=$(worker_pid $((NGPU - 1)))
echo "killing rank $((NGPU - 1)) (pid $victim) after step-$KILL_A was saved"; t0=$(date +%s%N)
kill -9 "$victim"
wait "$P0"; r0=$?; t_0=$(date +%s%N); wait "$P1"; r1=$?; t_1=$(date +%s%N)
echo "node 0 exit $r0 after $(( (t_0 - t0) / 1000000 )) ms, node 1 exit $r1 after $(( (t_1 - t0) / 1000000 )) ms"
grep -hE "ddprun:|error" "$OUT/kill_node0.log" "$OUT/kill_node1.log" | head -8
{ [ $r0 -ne 0 ] && [ $r0 -ne 124 ] && [ $r1 -ne 0 ] && [ $r1 -ne 124 ]; }; check $? "kill -> error exit"

step "--max-restarts 1: rank 1 killed once, the job resumes from the last checkpoint"
rm -rf "$OUT/restart"
# shellcheck disable=SC2046
timeout 300 $LAUNCH --standalone --max-restarts 1 --nproc-per-node "$NGPU" -- $TRAIN \
  $(train_args restart bf16 "$B") > "$OUT/restart.log" 2>&1 &
PL=$!
wait_for "$OUT/restart/step-$KILL_B"; victim=$(worker_pid 1)
echo "killing rank 1 (pid $victim) after step-$KILL_B was saved"; kill -9 "$victim"
wait $PL; check $? "restart"
grep -E "ddprun:|resumed from|adapter identical" "$OUT/restart.log" | head -6
grep -q "resumed from" "$OUT/restart.log"; check $? "resume after the restart"
$CMP restarted "$OUT/restart/metrics.jsonl" uninterrupted "$OUT/tr_w${NGPU}_bf16/metrics.jsonl" --tol 1e-6 \
  > "$OUT/cmp_restart.txt"; check $? "restarted vs uninterrupted"; tail -1 "$OUT/cmp_restart.txt"

echo; [ $fail -eq 0 ] && echo "ALL MULTI-GPU CHECKS PASSED" || echo "SOME MULTI-GPU CHECKS FAILED"
exit $fail
