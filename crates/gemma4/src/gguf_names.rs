//! llama.cpp's names for Gemma 4 tensors, for GGUF export of adapters: both model types are
//! llama.cpp architecture `gemma4`, and the projections of layer `i` are `blk.{i}.attn_q`,
//! `attn_k`, `attn_v`, `attn_output`, `ffn_gate`, `ffn_up`, `ffn_down` (`.weight`), under the
//! text prefix `model.language_model.` or `model.` (llama.cpp's converter maps both).

/// `general.architecture` of Gemma 4 GGUFs.
pub const LLAMA_CPP_ARCH: &str = "gemma4";

/// The GGUF tensor name of a projection's weight from its module path
/// (`model.language_model.layers.3.self_attn.q_proj` → `blk.3.attn_q.weight`); `None` for any
/// other module.
pub fn gguf_tensor_name(module_path: &str) -> Option<String> {
    let rest = module_path
        .strip_prefix("model.language_model.")
        .or_else(|| module_path.strip_prefix("model."))?;
    let rest = rest.strip_prefix("layers.")?;
    let (layer, proj) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let name = match proj {
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        _ => return None,
    };
    Some(format!("blk.{layer}.{name}.weight"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn projections_map_and_nothing_else_does() {
        let n = gguf_tensor_name;
        assert_eq!(
            n("model.language_model.layers.3.self_attn.q_proj").as_deref(),
            Some("blk.3.attn_q.weight")
        );
        assert_eq!(
            n("model.layers.12.mlp.down_proj").as_deref(),
            Some("blk.12.ffn_down.weight")
        );
        assert_eq!(
            n("model.language_model.layers.0.self_attn.o_proj").as_deref(),
            Some("blk.0.attn_output.weight")
        );
        for bad in [
            "model.language_model.embed_tokens",
            "model.vision_tower.layers.0.self_attn.q_proj",
            "model.language_model.layers.x.mlp.up_proj",
            "model.language_model.layers.1.router.proj",
        ] {
            assert_eq!(n(bad), None, "{bad}");
        }
    }
}
