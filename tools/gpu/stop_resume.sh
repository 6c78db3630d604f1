#!/usr/bin/env bash
# A run of train_ddp (the tiny model on CUDA) stopped by SIGINT under each launcher, then resumed:
# the worker must finish its step, save step-N and exit 130, and `--resume latest` must go on from
# step N. Run from the repository root after tools/gpu/build.sh (carry .gpu), after
# tools/gpu/machine_setup.sh; logs in $OUT (default out/gpu).
#   ddprun:   SIGINT to the launcher alone (it forwards it to its workers' process groups)
#   torchrun: SIGINT to the launcher alone, then to the launcher's whole process group (a
#             terminal's Ctrl-C, which reaches the workers too)
#   ddprun, during an evaluation: the sample chats 25 times as the eval set, evaluated after
#             every step; the evaluation in progress is abandoned, the step before it saved
set -uo pipefail
OUT="${OUT:-out/gpu}"; mkdir -p "$OUT"
train=(.gpu/train_ddp --config configs/tiny-cpu.toml --device cuda --dtype bf16 --save-every 100000)
extra=() # more train_ddp flags for the next stop_and_resume

# stop_and_resume NAME TARGET LAUNCHER...: TARGET is "launcher" or "group".
stop_and_resume() {
  local name=$1 target=$2; shift 2
  local dir="$OUT/stop-$name" log="$OUT/stop-$name.log"
  rm -rf "$dir"
  setsid "$@" "${train[@]}" "${extra[@]}" --max-steps 100000 --output "$dir" > "$log" 2>&1 &
  local pid=$!
  for _ in $(seq 240); do grep -qE "\| step +[0-9]+/100000" "$log" && break; sleep 0.5; done
  sleep 2
  local t0=$SECONDS
  if [ "$target" = group ]; then kill -INT -- "-$pid"; else kill -INT "$pid"; fi
  wait "$pid"; local rc=$?
  echo "$name ($target): exit code $rc after $((SECONDS - t0)) s"
  grep -E "SIGINT|stopped by|Received|death signal|waiting up to|evaluation at" "$log" | head -8
  local n
  n=$(grep -oE "stopped by SIGINT after step [0-9]+" "$log" | grep -oE "[0-9]+$")
  if [ -z "$n" ]; then echo "FAIL $name: no stop report"; return; fi
  ls "$dir"
  "$@" "${train[@]}" "${extra[@]}" --max-steps $((n + 2)) --resume latest --output "$dir" > "$log.resume" 2>&1
  echo "resume: exit code $?"
  grep -E "resumed from|checksum|eval @" "$log.resume"
}

stop_and_resume ddprun launcher .gpu/ddprun --standalone --nproc-per-node 1 --
stop_and_resume torchrun launcher torchrun --standalone --nproc_per_node=1 --no-python
stop_and_resume torchrun-ctrl-c group torchrun --standalone --nproc_per_node=1 --no-python
eval_set="$OUT/stop-eval.jsonl"
for _ in $(seq 25); do cat assets/sample/chat.jsonl; done > "$eval_set"
extra=(--eval-data "$eval_set" --eval-every 1)
stop_and_resume ddprun-eval launcher .gpu/ddprun --standalone --nproc-per-node 1 --
extra=()

# generate with the default device: GPU 0 in bf16, and it says so.
.gpu/generate --model assets/tiny --adapter "$OUT/stop-ddprun/$(ls "$OUT/stop-ddprun" | grep -E '^step-' | tail -1)" \
  --prompt "How many seconds are in 4 minutes?" --max-new-tokens 8 2>&1 | head -3
