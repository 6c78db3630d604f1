//! Build-script helper shared by the crates with CUDA kernels (`g4ft-ops`, `g4ft-ddp`): compiles
//! `kernels/<name>.cu` to `$OUT_DIR/<name>.ptx` with nvcc when the crate's `cuda` feature is on, and
//! does nothing otherwise (CPU-only builds need no CUDA toolchain). The crate embeds the PTX with
//! `include_str!` and candle loads it once per device (`get_or_load_custom_func`).
//!
//! Target: `compute_$CUDA_COMPUTE_CAP` PTX, JIT-compiled by the driver at first use. Without
//! `CUDA_COMPUTE_CAP` the first GPU that `nvidia-smi` reports is used, else 90 (H100/H200). nvcc
//! comes from `$NVCC`, else `$CUDA_HOME/bin/nvcc`, else `PATH`; its PTX version must be one the
//! GPU machine's driver loads (nvcc 13.0 for a CUDA 13.0 driver; `docs/cuda.md`). Chosen over NVRTC
//! because the GPU machine then needs no CUDA headers or libnvrtc at run time, and kernel errors
//! surface at build time.

use std::path::PathBuf;
use std::process::Command;

/// Compiles `kernels/<name>.cu` for every name (with `-Ikernels`, so kernels can share headers)
/// when `CARGO_FEATURE_CUDA` is set. `crate_name` prefixes the panic messages. Call from `build.rs`.
pub fn compile_kernels(crate_name: &str, kernels: &[&str]) {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=kernels");
    println!("cargo:rerun-if-env-changed=CUDA_COMPUTE_CAP");
    println!("cargo:rerun-if-env-changed=NVCC");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let cap = compute_cap();
    for name in kernels {
        compile(crate_name, name, &format!("compute_{cap}"));
    }
}

/// Kernels that use Hopper-only instructions (`wgmma`): compiled for `compute_90a` when the build
/// targets compute capability 90 (H100 / H200), which also sets `cfg(g4ft_hopper)` for the crate's
/// host code; not compiled for any other target, where the host code keeps its portable kernels.
/// Call from `build.rs` after [`compile_kernels`].
pub fn compile_hopper_kernels(crate_name: &str, kernels: &[&str]) {
    println!("cargo::rustc-check-cfg=cfg(g4ft_hopper)");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() || compute_cap() != "90" {
        return;
    }
    for name in kernels {
        compile(crate_name, name, "compute_90a");
    }
    println!("cargo:rustc-cfg=g4ft_hopper");
}

/// `CUDA_COMPUTE_CAP`, else the first GPU's, else 90.
fn compute_cap() -> String {
    std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| compute_cap_of_this_gpu())
}

/// `kernels/<name>.cu` to `$OUT_DIR/<name>.ptx` for the PTX target `arch`.
fn compile(crate_name: &str, name: &str, arch: &str) {
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let nvcc = std::env::var("NVCC").unwrap_or_else(|_| match std::env::var("CUDA_HOME") {
        Ok(home) => format!("{home}/bin/nvcc"),
        Err(_) => "nvcc".to_string(),
    });
    let src = format!("kernels/{name}.cu");
    let dst = out.join(format!("{name}.ptx"));
    let status = Command::new(&nvcc)
        .args(["--ptx", "-O3", "-std=c++17", "-Ikernels"])
        .arg(format!("-arch={arch}"))
        .arg(&src)
        .arg("-o")
        .arg(&dst)
        .status()
        .unwrap_or_else(|e| panic!("{crate_name} build.rs: cannot run `{nvcc}` for {src}: {e} (see docs/cuda.md; without a system CUDA: eval \"$(bash tools/cuda/setup_toolchain.sh)\")"));
    assert!(
        status.success(),
        "{crate_name} build.rs: nvcc failed on {src} ({status})"
    );
}

/// The compute capability of the first GPU `nvidia-smi` lists (`"8.0"` → `"80"`), or `"90"` when
/// there is none (a build machine without a GPU builds for H100/H200 unless told otherwise).
fn compute_cap_of_this_gpu() -> String {
    let detected = Command::new("nvidia-smi")
        .args(["--query-gpu=compute_cap", "--format=csv,noheader"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| {
            let text = String::from_utf8_lossy(&o.stdout).into_owned();
            let cap = text.lines().next()?.trim().replace('.', "");
            (!cap.is_empty() && cap.bytes().all(|b| b.is_ascii_digit())).then_some(cap)
        });
    detected.unwrap_or_else(|| "90".to_string())
}
