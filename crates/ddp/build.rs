//! Compiles `kernels/accumulate.cu` to PTX when the `cuda` feature is on (`g4ft-ptx-build`); the PTX
//! lands in `$OUT_DIR/accumulate.ptx` and is embedded by `src/accumulate.rs`.

fn main() {
    g4ft_ptx_build::compile_kernels("g4ft-ddp", &["accumulate"]);
}
