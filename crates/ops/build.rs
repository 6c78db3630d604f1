//! Compiles `kernels/<op>.cu` to PTX when the `cuda` feature is on (`g4ft-ptx-build`); each PTX lands
//! in `$OUT_DIR/<op>.ptx` and is embedded by `src/cuda.rs`. The Hopper-only kernels are built for
//! compute capability 90 alone and set `cfg(g4ft_hopper)`.

fn main() {
    g4ft_ptx_build::compile_kernels(
        "g4ft-ops",
        &[
            "rms_norm",
            "heads_norm",
            "rope",
            "softmax",
            "geglu",
            "cross_entropy",
            "attention",
            "attention_flash",
            "attention_flash_bwd",
            "adamw",
            "dropout",
            "lora",
            "transpose",
            "moe",
            "scale",
            "cast",
        ],
    );
    g4ft_ptx_build::compile_hopper_kernels("g4ft-ops", &["attention_wgmma", "moe_wgmma"]);
}
