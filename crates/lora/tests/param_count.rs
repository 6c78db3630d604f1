//! Trainable-parameter counting from shapes alone: the Gemma 4 12B text model with r = 16 on the
//! seven projections must give PEFT's 65,568,768 (`docs/gemma4.md` §1), whether targeted by
//! the blog post's regex or by a suffix list, with full-attention layers lacking v_proj.

use g4ft_lora::{count_trainable, LoraConfig, ParamReport, ProjectionShape, TargetModules};

/// 12B projection shapes (`docs/gemma4.md` §3): 48 layers, hidden 3840; full-attention layers 5, 11, ..., 47
/// have q (8192, 3840), k (512, 3840), no v_proj, o (3840, 8192); sliding layers q (4096, 3840),
/// k/v (2048, 3840), o (3840, 4096); every MLP gate/up (15360, 3840), down (3840, 15360).
fn gemma4_12b_shapes() -> Vec<ProjectionShape> {
    let h = 3840;
    let mut shapes = Vec::new();
    for l in 0..48 {
        let p = format!("model.language_model.layers.{l}");
        let full = (l + 1) % 6 == 0;
        let (q, kv) = if full { (8192, 512) } else { (4096, 2048) };
        shapes.push(ProjectionShape::new(format!("{p}.self_attn.q_proj"), h, q));
        shapes.push(ProjectionShape::new(format!("{p}.self_attn.k_proj"), h, kv));
        if !full {
            shapes.push(ProjectionShape::new(format!("{p}.self_attn.v_proj"), h, kv));
        }
        shapes.push(ProjectionShape::new(format!("{p}.self_attn.o_proj"), q, h));
        shapes.push(ProjectionShape::new(format!("{p}.mlp.gate_proj"), h, 15360));
        shapes.push(ProjectionShape::new(format!("{p}.mlp.up_proj"), h, 15360));
        shapes.push(ProjectionShape::new(format!("{p}.mlp.down_proj"), 15360, h));
    }
    shapes
}

const POST_REGEX: &str =
    r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)";

#[test]
fn gemma4_12b_r16_seven_projections() {
    let shapes = gemma4_12b_shapes();
    let regex = LoraConfig::new(16, 32.0, TargetModules::Regex(POST_REGEX.into()));
    assert_eq!(count_trainable(&regex, &shapes).unwrap(), 65_568_768);
    let names = [
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    ];
    let list = LoraConfig::new(
        16,
        32.0,
        TargetModules::List(names.iter().map(|s| s.to_string()).collect()),
    );
    assert_eq!(count_trainable(&list, &shapes).unwrap(), 65_568_768);
    // 11,907,350,272 text parameters (`docs/gemma4.md` §1).
    let report = ParamReport::new(&regex, &shapes, 11_907_350_272).unwrap();
    assert_eq!(
        report.to_string(),
        "trainable params: 65,568,768 || all params: 11,972,919,040 || trainable%: 0.5476"
    );
}

#[test]
fn pattern_matching_nothing_is_an_error_listing_paths() {
    let cfg = LoraConfig::new(16, 32.0, TargetModules::Regex(r".*\.qkv_proj".into()));
    let err = count_trainable(&cfg, &gemma4_12b_shapes())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("matched none")
            && err.contains("model.language_model.layers.0.self_attn.q_proj"),
        "{err}"
    );
}

#[test]
fn rank_pattern_changes_the_count() {
    let shapes = gemma4_12b_shapes();
    let mut cfg = LoraConfig::new(16, 32.0, TargetModules::List(vec!["down_proj".into()]));
    let base = count_trainable(&cfg, &shapes).unwrap();
    assert_eq!(base, 48 * 16 * (15360 + 3840));
    cfg.rank_pattern
        .insert(r"layers\.0\.mlp\.down_proj".into(), 8);
    assert_eq!(
        count_trainable(&cfg, &shapes).unwrap(),
        base - 8 * (15360 + 3840)
    );
}
