//! The launch contract of `src/cuda.rs`'s `LaunchArgs`, checked on the sources (it holds for every
//! build, with or without a GPU): on Hopper a kernel may be scheduled before the kernel ahead of
//! it has finished, so every `__global__` in `kernels/` must open with `G4FT_KERNEL_ENTRY()`
//! before it touches memory, and every launch in `src/` must go through `cuda::launch_args`.

use std::fs;
use std::path::{Path, PathBuf};

fn files(dir: &str, ext: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut out: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == ext))
        .collect();
    out.sort();
    out
}

/// The first statement of each kernel body in `src` (CUDA source), with the kernel's line.
fn kernel_openings(src: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(k) = src[at..].find("__global__") {
        let start = at + k;
        let brace = start + src[start..].find('{').expect("a kernel body");
        let body = &src[brace + 1..];
        let first = body
            .split(';')
            .next()
            .unwrap_or("")
            .replace('\\', " ")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        out.push((src[..start].matches('\n').count() + 1, first));
        at = brace;
    }
    out
}

#[test]
fn every_kernel_opens_with_the_entry() {
    let mut kernels = 0;
    for path in files("kernels", "cu") {
        let src = fs::read_to_string(&path).expect("kernel source");
        for (line, first) in kernel_openings(&src) {
            kernels += 1;
            assert_eq!(
                first,
                "G4FT_KERNEL_ENTRY()",
                "{}:{line}: the kernel's first statement must be G4FT_KERNEL_ENTRY()",
                path.display()
            );
        }
    }
    assert!(kernels > 40, "found only {kernels} kernels");
}

#[test]
fn every_launch_goes_through_launch_args() {
    for path in files("src", "rs") {
        let src = fs::read_to_string(&path).expect("source");
        for (i, line) in src.lines().enumerate() {
            assert!(
                !line.contains(concat!("launch_", "builder(")),
                "{}:{}: launch with cuda::launch_args, not cudarc's builder",
                path.display(),
                i + 1
            );
        }
    }
}

#[test]
fn the_opening_finder_reads_macro_bodies() {
    let src = "#define K(S) \\\n  extern \"C\" __global__ void k_##S(int* x) { \\\n    G4FT_KERNEL_ENTRY(); \\\n    x[0] = 1; \\\n  }\n__global__ void j(int n) { if (n) return; }\n";
    let got = kernel_openings(src);
    assert_eq!(
        got,
        vec![
            (2, "G4FT_KERNEL_ENTRY()".to_string()),
            (6, "if (n) return".to_string())
        ]
    );
}
