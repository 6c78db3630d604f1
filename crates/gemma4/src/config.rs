//! Gemma 4 text-decoder config: parsing `config.json` and deriving the per-layer settings.
//!
//! Mirrors `Gemma4TextConfig.__post_init__` / `kv_sharing_modes` (transformers 5.23,
//! `models/gemma4/configuration_gemma4.py`) and `Gemma4UnifiedTextConfig`
//! (`models/gemma4_unified/configuration_gemma4_unified.py`); see `docs/gemma4.md` §2.
//!
//! Accepted inputs: the multimodal config (`model_type` `gemma4` or `gemma4_unified`, text settings
//! in `text_config`) or a bare text config (`gemma4_text` / `gemma4_unified_text`). Both per-layer
//! forms are parsed: the release form (`global_head_dim`, `num_global_key_value_heads`) and the
//! `per_layer_config` form written by recent transformers. [`RawTextConfig`] keeps the JSON names;
//! [`Config`] is the validated, fully derived runtime config (one [`LayerConfig`] per layer).

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use crate::error::{Error, Result};

/// The text settings exactly as they appear in `config.json` (transformers names). Absent fields
/// are `None` and take the defaults of the text config class (they differ between `gemma4_text`
/// and `gemma4_unified_text`).
#[derive(Debug, Clone, Default, Deserialize)]
#[allow(missing_docs)]
pub struct RawTextConfig {
    pub model_type: Option<String>,
    pub vocab_size: Option<usize>,
    pub hidden_size: Option<usize>,
    pub intermediate_size: Option<usize>,
    pub num_hidden_layers: Option<usize>,
    pub num_attention_heads: Option<usize>,
    pub num_key_value_heads: Option<usize>,
    pub head_dim: Option<usize>,
    pub hidden_activation: Option<String>,
    pub max_position_embeddings: Option<usize>,
    pub rms_norm_eps: Option<f64>,
    pub pad_token_id: Option<u32>,
    pub tie_word_embeddings: Option<bool>,
    pub rope_parameters: Option<BTreeMap<String, RawRopeParameters>>,
    pub attention_bias: Option<bool>,
    pub attention_dropout: Option<f64>,
    pub sliding_window: Option<usize>,
    pub layer_types: Option<Vec<String>>,
    pub final_logit_softcapping: Option<f64>,
    pub use_bidirectional_attention: Option<String>,
    pub vocab_size_per_layer_input: Option<usize>,
    pub hidden_size_per_layer_input: Option<usize>,
    pub attention_k_eq_v: Option<bool>,
    pub num_kv_shared_layers: Option<usize>,
    pub enable_moe_block: Option<bool>,
    pub use_double_wide_mlp: Option<bool>,
    pub num_experts: Option<usize>,
    pub top_k_experts: Option<usize>,
    pub moe_intermediate_size: Option<usize>,
    pub global_head_dim: Option<usize>,
    pub num_global_key_value_heads: Option<usize>,
    pub per_layer_config: Option<BTreeMap<String, BTreeMap<String, Value>>>,
}

/// One entry of `rope_parameters` (per layer type).
#[derive(Debug, Clone, Default, Deserialize)]
#[allow(missing_docs)]
pub struct RawRopeParameters {
    pub rope_type: Option<String>,
    pub rope_theta: Option<f64>,
    pub partial_rotary_factor: Option<f64>,
    pub factor: Option<f64>,
}

/// Attention type of a decoder layer (`layer_types` entry).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LayerType {
    /// `sliding_attention`: causal, the last `sliding_window` keys (including the query itself).
    Sliding,
    /// `full_attention`: causal over the whole sequence.
    Full,
}

impl LayerType {
    /// The transformers name (`sliding_attention` / `full_attention`).
    pub fn name(self) -> &'static str {
        match self {
            LayerType::Sliding => "sliding_attention",
            LayerType::Full => "full_attention",
        }
    }
}

/// RoPE frequency scheme of one layer type.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeType {
    /// `inv_freq[k] = 1 / theta^(2k/d)` for all `d/2` pairs.
    Default,
    /// Gemma 4 `proportional`: only the first `int(p·d // 2)` pairs rotate (exponent denominator
    /// is the full `d`); the remaining inverse frequencies are 0. All divided by `factor`.
    Proportional,
}

/// Resolved RoPE parameters of one layer type.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeParams {
    /// Frequency scheme.
    pub rope_type: RopeType,
    /// Base wavelength `rope_theta`.
    pub rope_theta: f64,
    /// Rotated fraction of the head (proportional only; 1.0 otherwise).
    pub partial_rotary_factor: f64,
    /// Divides `inv_freq` (proportional only; 1.0 when absent).
    pub factor: f64,
}

/// KV-sharing role of a layer (`kv_sharing_modes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvSharing {
    /// Computes and uses its own K/V.
    None,
    /// Computes its own K/V and lends them to the later consumers of its type.
    Store,
    /// Has no `k_proj`/`v_proj`/`k_norm`: uses the K/V of `producer` (same layer type).
    Reuse {
        /// Index of the producing (`Store`) layer.
        producer: usize,
    },
}

/// Everything that differs between decoder layers.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerConfig {
    /// Sliding or full attention.
    pub layer_type: LayerType,
    /// Head size `d` of this layer (`global_head_dim` on full layers).
    pub head_dim: usize,
    /// Number of K/V heads of this layer.
    pub num_key_value_heads: usize,
    /// `true` when V comes from its own `v_proj`; `false` on `attention_k_eq_v` full layers
    /// (V = v_norm of the raw `k_proj` output). Irrelevant for `Reuse` layers.
    pub has_v_proj: bool,
    /// KV-sharing role.
    pub kv_sharing: KvSharing,
    /// Width of the dense MLP (doubled on `Reuse` layers with `use_double_wide_mlp`).
    pub intermediate_size: usize,
}

impl LayerConfig {
    /// `true` for layers that own `k_proj`/`k_norm` (everything except KV consumers).
    pub fn has_kv_proj(&self) -> bool {
        !matches!(self.kv_sharing, KvSharing::Reuse { .. })
    }
}

/// Mixture-of-experts settings (26B-A4B).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoeConfig {
    /// Number of experts `E`.
    pub num_experts: usize,
    /// Experts used per token.
    pub top_k_experts: usize,
    /// Width of each expert's GeGLU.
    pub moe_intermediate_size: usize,
}

/// Validated Gemma 4 text-decoder config with every per-layer value derived.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Top-level `model_type` (`gemma4`, `gemma4_unified`, or the text type for bare configs).
    pub model_type: String,
    /// Text `model_type` (`gemma4_text` or `gemma4_unified_text`).
    pub text_model_type: String,
    /// Rows of `embed_tokens` (and logits width).
    pub vocab_size: usize,
    /// `H`.
    pub hidden_size: usize,
    /// Base dense MLP width (see [`LayerConfig::intermediate_size`] for the per-layer value).
    pub intermediate_size: usize,
    /// `L`.
    pub num_hidden_layers: usize,
    /// Query heads (all layers).
    pub num_attention_heads: usize,
    /// Sliding-layer K/V heads (global value).
    pub num_key_value_heads: usize,
    /// Sliding-layer head size (global value).
    pub head_dim: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// Effective sliding window `W` (already halved+1 for `use_bidirectional_attention = "all"`).
    pub sliding_window: usize,
    /// `false` only for `use_bidirectional_attention = "all"`.
    pub is_causal: bool,
    /// `max_position_embeddings` (informational).
    pub max_position_embeddings: usize,
    /// `final_logit_softcapping` (30.0 in every release).
    pub final_logit_softcapping: Option<f64>,
    /// `use_bidirectional_attention` (`"vision"` only matters for multimodal inputs).
    pub use_bidirectional_attention: Option<String>,
    /// Per-layer-embedding width (0 = no PLE).
    pub hidden_size_per_layer_input: usize,
    /// Rows of `embed_tokens_per_layer`.
    pub vocab_size_per_layer_input: usize,
    /// Full layers take V from the raw `k_proj` output.
    pub attention_k_eq_v: bool,
    /// Number of trailing KV-consumer layers.
    pub num_kv_shared_layers: usize,
    /// `use_double_wide_mlp`.
    pub use_double_wide_mlp: bool,
    /// MoE block on every layer (26B-A4B).
    pub moe: Option<MoeConfig>,
    /// RoPE of sliding layers.
    pub rope_sliding: RopeParams,
    /// RoPE of full layers.
    pub rope_full: RopeParams,
    /// Padding token id (embedding row without gradient).
    pub pad_token_id: u32,
    /// Per-layer settings, index = layer.
    pub layers: Vec<LayerConfig>,
}

/// A projection (`LoraLinear`) of the model: module path and shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProjectionShape {
    /// Decoder layer index.
    pub layer: usize,
    /// Checkpoint module path, e.g. `model.language_model.layers.5.self_attn.q_proj`.
    pub path: String,
    /// `in_features`.
    pub in_features: usize,
    /// `out_features`.
    pub out_features: usize,
}

#[derive(Debug, Deserialize)]
struct RawTopConfig {
    model_type: Option<String>,
    text_config: Option<Value>,
}

struct Ctx<'a> {
    file: &'a str,
    prefix: &'a str,
}

impl Ctx<'_> {
    fn err(&self, field: &str, msg: impl Into<String>) -> Error {
        Error::config(self.file, &format!("{}{field}", self.prefix), msg)
    }
}

impl Config {
    /// Reads and derives a config from a `config.json` file, or from the `config.json` of a model
    /// directory. A `.toml` path (a training config, given by mistake) is an error saying so.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let given = path.as_ref();
        let in_dir = given.join("config.json");
        let path = if given.is_dir() { &in_dir } else { given };
        if path.extension().is_some_and(|e| e == "toml") {
            return Err(Error::Resolve {
                model: path.display().to_string(),
                msg: "a TOML file is a training config; this takes a model's config.json or its \
                      directory (the training config's `model`)"
                    .into(),
            });
        }
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_json_str(&text, &path.display().to_string())
    }

    /// Parses a config from JSON text; `file` names the source in error messages.
    pub fn from_json_str(text: &str, file: &str) -> Result<Self> {
        let top: Value = serde_json::from_str(text).map_err(|source| Error::Json {
            file: file.to_string(),
            source,
        })?;
        let head: RawTopConfig =
            serde_json::from_value(top.clone()).map_err(|source| Error::Json {
                file: file.to_string(),
                source,
            })?;
        let model_type = head
            .model_type
            .clone()
            .ok_or_else(|| Error::config(file, "model_type", "missing"))?;
        let (text_value, prefix) = match model_type.as_str() {
            "gemma4" | "gemma4_unified" => {
                let tc = head.text_config.ok_or_else(|| {
                    Error::config(file, "text_config", format!("missing for `{model_type}`"))
                })?;
                (tc, "text_config.")
            }
            "gemma4_text" | "gemma4_unified_text" => (top, ""),
            other => {
                return Err(Error::config(
                    file,
                    "model_type",
                    format!(
                        "expected gemma4, gemma4_unified, gemma4_text or gemma4_unified_text, got `{other}`"
                    ),
                ))
            }
        };
        let raw: RawTextConfig = serde_json::from_value(text_value).map_err(|e| {
            Error::config(file, prefix.trim_end_matches('.'), format!("invalid: {e}"))
        })?;
        let default_text_type = match model_type.as_str() {
            "gemma4_unified" | "gemma4_unified_text" => "gemma4_unified_text",
            _ => "gemma4_text",
        };
        let ctx = Ctx { file, prefix };
        Self::derive(model_type.clone(), default_text_type, &raw, &ctx)
    }

    /// Builds the runtime config from a raw text config (defaults of `default_text_type`'s class).
    pub fn from_raw(raw: &RawTextConfig, default_text_type: &str) -> Result<Self> {
        let ctx = Ctx {
            file: "<config>",
            prefix: "",
        };
        Self::derive(default_text_type.to_string(), default_text_type, raw, &ctx)
    }

    fn derive(
        model_type: String,
        default_text_type: &str,
        raw: &RawTextConfig,
        ctx: &Ctx,
    ) -> Result<Self> {
        let text_model_type = raw
            .model_type
            .clone()
            .unwrap_or_else(|| default_text_type.to_string());
        let unified = match text_model_type.as_str() {
            "gemma4_text" => false,
            "gemma4_unified_text" => true,
            other => {
                return Err(ctx.err(
                    "model_type",
                    format!("expected gemma4_text or gemma4_unified_text, got `{other}`"),
                ))
            }
        };
        let hidden_size = raw.hidden_size.unwrap_or(2304);
        let num_hidden_layers = raw.num_hidden_layers.unwrap_or(30);
        let num_attention_heads = raw.num_attention_heads.unwrap_or(8);
        let num_key_value_heads = raw.num_key_value_heads.unwrap_or(4);
        let head_dim = raw.head_dim.unwrap_or(256);
        let intermediate_size = raw.intermediate_size.unwrap_or(9216);
        for (name, v) in [
            ("hidden_size", hidden_size),
            ("num_hidden_layers", num_hidden_layers),
            ("num_attention_heads", num_attention_heads),
            ("num_key_value_heads", num_key_value_heads),
            ("head_dim", head_dim),
            ("intermediate_size", intermediate_size),
        ] {
            if v == 0 {
                return Err(ctx.err(name, "must be > 0"));
            }
        }
        check_supported(raw, ctx)?;
        let (bidir, is_causal, sliding_window) = derive_attention_mode(raw, unified, ctx)?;

        let layer_types = derive_layer_types(raw, num_hidden_layers, ctx)?;
        let (rope_sliding, rope_full) = derive_rope(raw, ctx)?;

        let attention_k_eq_v = raw.attention_k_eq_v.unwrap_or(false);
        let (hidden_size_per_layer_input, vocab_size_per_layer_input) = if unified {
            (0, 0)
        } else {
            (
                raw.hidden_size_per_layer_input.unwrap_or(256),
                raw.vocab_size_per_layer_input.unwrap_or(262_144),
            )
        };
        let moe = if !unified && raw.enable_moe_block.unwrap_or(false) {
            Some(derive_moe(raw, ctx)?)
        } else {
            None
        };
        let num_kv_shared_layers = raw.num_kv_shared_layers.unwrap_or(0);
        if num_kv_shared_layers >= num_hidden_layers && num_kv_shared_layers > 0 {
            return Err(ctx.err(
                "num_kv_shared_layers",
                format!("{num_kv_shared_layers} must be < num_hidden_layers {num_hidden_layers}"),
            ));
        }
        let use_double_wide_mlp = raw.use_double_wide_mlp.unwrap_or(false);

        let overrides = derive_per_layer_overrides(
            raw,
            &layer_types,
            head_dim,
            num_key_value_heads,
            attention_k_eq_v,
            ctx,
        )?;
        let sharing = derive_kv_sharing(&layer_types, num_kv_shared_layers, ctx)?;

        let layers = derive_layers(
            &layer_types,
            &overrides,
            &sharing,
            LayerShape {
                num_attention_heads,
                intermediate_size,
                attention_k_eq_v,
                use_double_wide_mlp,
            },
            ctx,
        )?;

        Ok(Config {
            model_type,
            text_model_type,
            vocab_size: raw.vocab_size.unwrap_or(262_144),
            hidden_size,
            intermediate_size,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rms_norm_eps: raw.rms_norm_eps.unwrap_or(1e-6),
            sliding_window,
            is_causal,
            max_position_embeddings: raw.max_position_embeddings.unwrap_or(if unified {
                262_144
            } else {
                131_072
            }),
            final_logit_softcapping: raw.final_logit_softcapping,
            use_bidirectional_attention: bidir,
            hidden_size_per_layer_input,
            vocab_size_per_layer_input,
            attention_k_eq_v,
            num_kv_shared_layers,
            use_double_wide_mlp,
            moe,
            rope_sliding,
            rope_full,
            pad_token_id: raw.pad_token_id.unwrap_or(0),
            layers,
        })
    }

    /// RoPE parameters of a layer type.
    pub fn rope(&self, t: LayerType) -> &RopeParams {
        match t {
            LayerType::Sliding => &self.rope_sliding,
            LayerType::Full => &self.rope_full,
        }
    }

    /// Head size used by the RoPE table of a layer type (`None` if no layer has that type).
    pub fn rope_head_dim(&self, t: LayerType) -> Option<usize> {
        self.layers
            .iter()
            .find(|l| l.layer_type == t)
            .map(|l| l.head_dim)
    }

    /// `√H` embedding scale (before any rounding to the weight dtype).
    pub fn embed_scale(&self) -> f64 {
        (self.hidden_size as f64).sqrt()
    }

    /// The projections (`LoraLinear`s) in model order — for each layer `q, k, v, o, gate, up,
    /// down`, skipping those the layer does not have — with `prefix` prepended
    /// (`model.language_model` for real checkpoints, `model` for text-only saves).
    pub fn projection_shapes(&self, prefix: &str) -> Vec<ProjectionShape> {
        let h = self.hidden_size;
        let nh = self.num_attention_heads;
        let mut out = Vec::new();
        for (i, l) in self.layers.iter().enumerate() {
            let base = format!("{prefix}.layers.{i}");
            let d = l.head_dim;
            let kv = l.num_key_value_heads;
            let mut push = |name: &str, inf: usize, outf: usize| {
                out.push(ProjectionShape {
                    layer: i,
                    path: format!("{base}.{name}"),
                    in_features: inf,
                    out_features: outf,
                })
            };
            push("self_attn.q_proj", h, nh * d);
            if l.has_kv_proj() {
                push("self_attn.k_proj", h, kv * d);
                if l.has_v_proj {
                    push("self_attn.v_proj", h, kv * d);
                }
            }
            push("self_attn.o_proj", nh * d, h);
            push("mlp.gate_proj", h, l.intermediate_size);
            push("mlp.up_proj", h, l.intermediate_size);
            push("mlp.down_proj", l.intermediate_size, h);
        }
        out
    }

    /// Number of text-decoder parameters (embedding, norms, projections, PLE, MoE), computed from
    /// the config alone. Excludes the `layer_scalar` buffers, as `model.num_parameters()` does.
    pub fn num_text_parameters(&self) -> u64 {
        let h = self.hidden_size as u64;
        let l_count = self.num_hidden_layers as u64;
        let p = self.hidden_size_per_layer_input as u64;
        let mut n = self.vocab_size as u64 * h + h;
        if p > 0 {
            n += self.vocab_size_per_layer_input as u64 * l_count * p + l_count * p * h + p;
        }
        for s in self.projection_shapes("") {
            n += (s.in_features * s.out_features) as u64;
        }
        for l in &self.layers {
            let d = l.head_dim as u64;
            n += 4 * h + d; // sandwich norms + q_norm
            if l.has_kv_proj() {
                n += d; // k_norm (v_norm has no weight)
            }
            if p > 0 {
                n += 2 * p * h + h; // per_layer_input_gate, per_layer_projection, post_per_layer_input_norm
            }
            if let Some(m) = &self.moe {
                let e = m.num_experts as u64;
                let im = m.moe_intermediate_size as u64;
                n += e * h + h + e; // router.proj, router.scale, router.per_expert_scale
                n += e * 2 * im * h + e * h * im; // experts.gate_up_proj, experts.down_proj
                n += 3 * h; // pre_feedforward_layernorm_2, post_feedforward_layernorm_{1,2}
            }
        }
        n
    }
}

/// Settings no release uses and the model does not implement: an error naming the field.
fn check_supported(raw: &RawTextConfig, ctx: &Ctx) -> Result<()> {
    if let Some(act) = &raw.hidden_activation {
        if act != "gelu_pytorch_tanh" {
            return Err(ctx.err(
                "hidden_activation",
                format!("expected gelu_pytorch_tanh, got `{act}`"),
            ));
        }
    }
    if raw.attention_bias == Some(true) {
        return Err(ctx.err(
            "attention_bias",
            "true is not supported (no release uses it)",
        ));
    }
    if let Some(p) = raw.attention_dropout.filter(|&p| p != 0.0) {
        return Err(ctx.err(
            "attention_dropout",
            format!("{p} is not supported: attention dropout is not implemented (every release has 0.0)"),
        ));
    }
    if raw.tie_word_embeddings == Some(false) {
        return Err(ctx.err(
            "tie_word_embeddings",
            "false is not supported: the head is tied to embed_tokens in every release",
        ));
    }
    Ok(())
}

/// `use_bidirectional_attention` (the unified class defaults to `"vision"`), whether the text
/// attends causally (not with `"all"`), and the sliding window, which bidirectional attention
/// turns into `window / 2 + 1` tokens each side.
fn derive_attention_mode(
    raw: &RawTextConfig,
    unified: bool,
    ctx: &Ctx,
) -> Result<(Option<String>, bool, usize)> {
    let bidir = raw.use_bidirectional_attention.clone().or(if unified {
        Some("vision".to_string())
    } else {
        None
    });
    if let Some(b) = &bidir {
        if b != "vision" && b != "all" {
            return Err(ctx.err(
                "use_bidirectional_attention",
                format!("expected null, \"vision\" or \"all\", got `{b}`"),
            ));
        }
    }
    let mut sliding_window = raw
        .sliding_window
        .unwrap_or(if unified { 1024 } else { 512 });
    let is_causal = bidir.as_deref() != Some("all");
    if !is_causal {
        sliding_window = sliding_window / 2 + 1;
    }
    if sliding_window == 0 {
        return Err(ctx.err("sliding_window", "must be > 0"));
    }
    Ok((bidir, is_causal, sliding_window))
}

/// The expert settings of a config with `enable_moe_block`: each required and > 0, top-k at
/// most the expert count.
fn derive_moe(raw: &RawTextConfig, ctx: &Ctx) -> Result<MoeConfig> {
    let get = |name: &str, v: Option<usize>| {
        v.filter(|&v| v > 0)
            .ok_or_else(|| ctx.err(name, "required (> 0) when enable_moe_block is true"))
    };
    let m = MoeConfig {
        num_experts: get("num_experts", raw.num_experts)?,
        top_k_experts: get("top_k_experts", raw.top_k_experts)?,
        moe_intermediate_size: get("moe_intermediate_size", raw.moe_intermediate_size)?,
    };
    if m.top_k_experts > m.num_experts {
        return Err(ctx.err(
            "top_k_experts",
            format!("{} exceeds num_experts {}", m.top_k_experts, m.num_experts),
        ));
    }
    Ok(m)
}

/// The settings every layer's shape derives from, besides its type and overrides.
struct LayerShape {
    num_attention_heads: usize,
    intermediate_size: usize,
    attention_k_eq_v: bool,
    use_double_wide_mlp: bool,
}

/// One [`LayerConfig`] per layer from its type, its `(head_dim, kv heads)` override and its K/V
/// sharing mode, checking what the model relies on: the query heads divide into the kv heads,
/// a layer reusing K/V has its producer's geometry, and each layer type has one even head_dim
/// (its RoPE table).
fn derive_layers(
    layer_types: &[LayerType],
    overrides: &[(usize, usize)],
    sharing: &[KvSharing],
    shape: LayerShape,
    ctx: &Ctx,
) -> Result<Vec<LayerConfig>> {
    let LayerShape {
        num_attention_heads,
        intermediate_size,
        attention_k_eq_v,
        use_double_wide_mlp,
    } = shape;
    let mut layers = Vec::with_capacity(layer_types.len());
    for (i, &layer_type) in layer_types.iter().enumerate() {
        let (d, kv) = overrides[i];
        if !num_attention_heads.is_multiple_of(kv) {
            return Err(ctx.err(
                "num_key_value_heads",
                format!("layer {i}: {num_attention_heads} attention heads not divisible by {kv} kv heads"),
            ));
        }
        let kv_sharing = sharing[i];
        let reuse = matches!(kv_sharing, KvSharing::Reuse { .. });
        layers.push(LayerConfig {
            layer_type,
            head_dim: d,
            num_key_value_heads: kv,
            has_v_proj: !(attention_k_eq_v && layer_type == LayerType::Full),
            kv_sharing,
            intermediate_size: intermediate_size * if use_double_wide_mlp && reuse { 2 } else { 1 },
        });
    }
    // Consumers use the producer's K/V, so both must agree on the K/V geometry.
    for (i, l) in layers.iter().enumerate() {
        if let KvSharing::Reuse { producer } = l.kv_sharing {
            let p = &layers[producer];
            if (p.head_dim, p.num_key_value_heads) != (l.head_dim, l.num_key_value_heads) {
                return Err(ctx.err(
                    "per_layer_config",
                    format!(
                        "layer {i} reuses K/V of layer {producer} but their (head_dim, kv heads) differ: {:?} vs {:?}",
                        (l.head_dim, l.num_key_value_heads),
                        (p.head_dim, p.num_key_value_heads)
                    ),
                ));
            }
        }
    }
    let rope_check = |t: LayerType| -> Result<()> {
        if let Some(l) = layers.iter().find(|l| l.layer_type == t) {
            if l.head_dim % 2 != 0 {
                return Err(ctx.err("head_dim", format!("{} must be even for RoPE", l.head_dim)));
            }
            if layers
                .iter()
                .any(|o| o.layer_type == t && o.head_dim != l.head_dim)
            {
                return Err(ctx.err(
                    "per_layer_config",
                    format!(
                        "all {} layers must share one head_dim (RoPE table)",
                        t.name()
                    ),
                ));
            }
        }
        Ok(())
    };
    rope_check(LayerType::Sliding)?;
    rope_check(LayerType::Full)?;
    Ok(layers)
}

fn derive_layer_types(raw: &RawTextConfig, n: usize, ctx: &Ctx) -> Result<Vec<LayerType>> {
    let mut types = match &raw.layer_types {
        None => (0..n)
            .map(|i| {
                if (i + 1) % 6 == 0 {
                    LayerType::Full
                } else {
                    LayerType::Sliding
                }
            })
            .collect::<Vec<_>>(),
        Some(v) => {
            if v.len() != n {
                return Err(ctx.err(
                    "layer_types",
                    format!("expected {n} entries (num_hidden_layers), got {}", v.len()),
                ));
            }
            v.iter()
                .enumerate()
                .map(|(i, s)| match s.as_str() {
                    "sliding_attention" => Ok(LayerType::Sliding),
                    "full_attention" => Ok(LayerType::Full),
                    other => Err(ctx.err(
                        &format!("layer_types[{i}]"),
                        format!("expected sliding_attention or full_attention, got `{other}`"),
                    )),
                })
                .collect::<Result<Vec<_>>>()?
        }
    };
    // transformers forces the last layer to full attention (with a warning).
    if let Some(last) = types.last_mut() {
        *last = LayerType::Full;
    }
    Ok(types)
}

fn derive_rope(raw: &RawTextConfig, ctx: &Ctx) -> Result<(RopeParams, RopeParams)> {
    let default_sliding = RopeParams {
        rope_type: RopeType::Default,
        rope_theta: 10_000.0,
        partial_rotary_factor: 1.0,
        factor: 1.0,
    };
    let default_full = RopeParams {
        rope_type: RopeType::Proportional,
        rope_theta: 1_000_000.0,
        partial_rotary_factor: 0.25,
        factor: 1.0,
    };
    let Some(map) = &raw.rope_parameters else {
        return Ok((default_sliding, default_full));
    };
    let parse = |key: &str| -> Result<RopeParams> {
        let field = format!("rope_parameters.{key}");
        let r = map
            .get(key)
            .ok_or_else(|| ctx.err(&field, "missing (one entry per layer type is required)"))?;
        let rope_type = match r.rope_type.as_deref() {
            Some("default") | None => RopeType::Default,
            Some("proportional") => RopeType::Proportional,
            Some(other) => {
                return Err(ctx.err(
                    &format!("{field}.rope_type"),
                    format!("expected default or proportional, got `{other}`"),
                ))
            }
        };
        let rope_theta = r
            .rope_theta
            .ok_or_else(|| ctx.err(&format!("{field}.rope_theta"), "missing"))?;
        Ok(RopeParams {
            rope_type,
            rope_theta,
            partial_rotary_factor: match rope_type {
                RopeType::Proportional => r.partial_rotary_factor.unwrap_or(1.0),
                RopeType::Default => 1.0,
            },
            factor: match rope_type {
                RopeType::Proportional => r.factor.unwrap_or(1.0),
                RopeType::Default => 1.0,
            },
        })
    };
    Ok((parse("sliding_attention")?, parse("full_attention")?))
}

/// (head_dim, num_key_value_heads) per layer, from either per-layer form.
fn derive_per_layer_overrides(
    raw: &RawTextConfig,
    layer_types: &[LayerType],
    head_dim: usize,
    kv_heads: usize,
    k_eq_v: bool,
    ctx: &Ctx,
) -> Result<Vec<(usize, usize)>> {
    let mut out = vec![(head_dim, kv_heads); layer_types.len()];
    match &raw.per_layer_config {
        None => {
            let global_d = raw.global_head_dim.unwrap_or(512);
            // Only `attention_k_eq_v` models take `num_global_key_value_heads`.
            let global_kv = if k_eq_v {
                raw.num_global_key_value_heads
            } else {
                None
            };
            for (i, t) in layer_types.iter().enumerate() {
                if *t == LayerType::Full {
                    out[i] = (global_d, global_kv.unwrap_or(kv_heads));
                }
            }
        }
        Some(map) => {
            for (key, entry) in map {
                let field = format!("per_layer_config.{key}");
                let idx: usize = key
                    .parse()
                    .map_err(|_| ctx.err(&field, "keys must be layer indices (e.g. \"05\")"))?;
                if idx >= layer_types.len() {
                    return Err(ctx.err(
                        &field,
                        format!("layer index {idx} out of range 0..{}", layer_types.len()),
                    ));
                }
                for (attr, v) in entry {
                    let val = v.as_u64().filter(|&x| x > 0).ok_or_else(|| {
                        ctx.err(
                            &format!("{field}.{attr}"),
                            format!("expected a positive integer, got {v}"),
                        )
                    })? as usize;
                    match attr.as_str() {
                        "head_dim" => out[idx].0 = val,
                        "num_key_value_heads" => out[idx].1 = val,
                        other => {
                            return Err(ctx.err(
                                &format!("{field}.{other}"),
                                "unsupported per-layer attribute (supported: head_dim, num_key_value_heads)",
                            ))
                        }
                    }
                }
            }
        }
    }
    Ok(out)
}

fn derive_kv_sharing(types: &[LayerType], shared: usize, ctx: &Ctx) -> Result<Vec<KvSharing>> {
    let n = types.len();
    let mut modes = vec![KvSharing::None; n];
    if shared == 0 {
        return Ok(modes);
    }
    let first = n - shared;
    for t in [LayerType::Sliding, LayerType::Full] {
        if !types.contains(&t) {
            continue;
        }
        let producer = (0..first).rev().find(|&i| types[i] == t).ok_or_else(|| {
            ctx.err(
                "num_kv_shared_layers",
                format!(
                    "no {} layer before the first shared layer {first} to produce K/V",
                    t.name()
                ),
            )
        })?;
        modes[producer] = KvSharing::Store;
        for (i, m) in modes.iter_mut().enumerate().skip(first) {
            if types[i] == t {
                *m = KvSharing::Reuse { producer };
            }
        }
    }
    Ok(modes)
}
