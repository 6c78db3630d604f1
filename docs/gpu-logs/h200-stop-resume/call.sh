# GPU call of this session (main 9f7a367): run_checks.sh with the SIGINT stop/resume checks and generate's default device. Not carried (64 MiB with the tree): g4ft_ops_test (kernels unchanged since the 206-row table of stop 49) and ddp_test_worker.
cp .gpu/call/*.xz .gpu/call/source_dir .gpu/
export OUT
time bash tools/gpu/run_checks.sh
