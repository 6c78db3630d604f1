# GPU call of stop 54 (main d61f361; kernels unchanged since 58dd058, so no layer-wise or ops rows): parity,
# score through the data pipeline (token rows and chat rows, f32/bf16), tiny training under
# both launchers, stop/resume (the launcher stop-reason pipe), a short 12B bench_train step.
cp .gpu/call54/*.xz .gpu/call54/source_dir .gpu/
export OUT
source tools/gpu/machine_setup.sh
step() { echo; echo "=== $*"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
step parity; G4FT_TEST_DEVICE=cuda .gpu/gemma4_parity --nocapture --test-threads 1 > "$OUT/parity.log" 2>&1; grep -E "test result|FAIL" "$OUT/parity.log"
for dt in f32 bf16; do
  step "score $dt: token rows, then the chats they were prepared from"
  .gpu/score --model assets/tiny --data assets/sample/tokens.jsonl --device cuda --dtype $dt 2>&1 | tail -1
  .gpu/score --model assets/tiny --data assets/sample/chat.jsonl --labels assistant_only --max-len 256 --device cuda --dtype $dt 2>&1 | tail -1
done
step stop_resume; bash tools/gpu/stop_resume.sh > "$OUT/stop_resume.log" 2>&1; echo "rc=$?"
grep -E "exit code|stopped by|launcher is stopping|resumed from|checksum|rc=|error" "$OUT/stop_resume.log" | head -40
step "tiny bf16 under ddprun"; .gpu/ddprun --standalone --nproc-per-node 1 -- .gpu/train_ddp --config configs/tiny-cpu.toml --device cuda --dtype bf16 --output "$OUT/tiny-ddprun" 2>&1 | tail -3
step "tiny bf16 under torchrun"; torchrun --standalone --nproc_per_node=1 --no-python .gpu/train_ddp --config configs/tiny-cpu.toml --device cuda --dtype bf16 --max-steps 10 --output "$OUT/tiny-torchrun" 2>&1 | tail -3
step "bench_train 12B"; timeout 240 .gpu/bench_train --config crates/gemma4/tests/configs/gemma-4-12B-it.json --device cuda --dtype bf16 --seq 2048 --micro-batch 1 --accum 8 --steps 3 --warmup-discard 1 > "$OUT/bench_train.log" 2>&1; grep -E "SUMMARY" "$OUT/bench_train.log"
rm -rf "$OUT"/stop-*/step-* "$OUT"/tiny-*/step-* "$OUT"/stop-eval.jsonl
