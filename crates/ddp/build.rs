//! Compiles `kernels/accumulate.cu` to PTX with nvcc when the `cuda` feature is on (nothing
//! otherwise, so CPU-only builds need no CUDA toolchain). The PTX lands in
//! `$OUT_DIR/accumulate.ptx`, is embedded by `src/accumulate.rs` with `include_str!` and loaded once
//! per device by candle (`get_or_load_custom_func`). Same toolchain rules as `crates/ops/build.rs`:
//! `compute_$CUDA_COMPUTE_CAP` PTX (default 90), nvcc from `$NVCC`, `$CUDA_HOME/bin` or `PATH`.

use std::path::PathBuf;
use std::process::Command;

const KERNELS: &[&str] = &["accumulate"];

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=kernels");
    println!("cargo:rerun-if-env-changed=CUDA_COMPUTE_CAP");
    println!("cargo:rerun-if-env-changed=NVCC");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let cap = std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "90".to_string());
    let nvcc = std::env::var("NVCC").unwrap_or_else(|_| match std::env::var("CUDA_HOME") {
        Ok(home) => format!("{home}/bin/nvcc"),
        Err(_) => "nvcc".to_string(),
    });
    for name in KERNELS {
        let src = format!("kernels/{name}.cu");
        let dst = out.join(format!("{name}.ptx"));
        let status = Command::new(&nvcc)
            .args(["--ptx", "-O3", "-std=c++17"])
            .arg(format!("-arch=compute_{cap}"))
            .arg(&src)
            .arg("-o")
            .arg(&dst)
            .status()
            .unwrap_or_else(|e| panic!("g4ft-ddp build.rs: cannot run `{nvcc}` for {src}: {e} (hint: eval \"$(bash ../shared/cuda/setup-cuda-build.sh)\")"));
        assert!(
            status.success(),
            "g4ft-ddp build.rs: nvcc failed on {src} ({status})"
        );
    }
}
