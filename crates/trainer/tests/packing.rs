//! Packed rows through the trainer glue: the loss of a packed batch equals the sum of its
//! samples' losses computed alone (f32, CPU, the tiny model: samples longer than its sliding
//! window of 16, so the window must also stay inside each sample), with the packed batch on the
//! fused attention (sequence starts, no dense mask).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::{DType, Device};
use g4ft_data::{
    Batching, DataLoader, DatasetOptions, Encoder, LoaderConfig, PadCollate, Sample, TokenDataset,
};
use g4ft_gemma4::mask::AttentionBias;
use g4ft_gemma4::Gemma4Model;
use g4ft_lora::{InitLoraWeights, LoraConfig, LoraContext, TargetModules};
use g4ft_trainer::step::token_batch;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn dataset() -> Arc<TokenDataset> {
    let tiny = repo().join("assets/tiny");
    let enc = Encoder::from_model_dir(&tiny).unwrap();
    let cache = std::env::temp_dir().join(format!("g4ft-packing-{}", std::process::id()));
    let opts = DatasetOptions {
        cache_dir: Some(cache),
        ..Default::default()
    };
    Arc::new(
        TokenDataset::open(&repo().join("assets/sample/chat.jsonl"), Some(&enc), &opts).unwrap(),
    )
}

fn loss_sum(model: &Gemma4Model, batch: &g4ft_data::Batch) -> f64 {
    let out = model
        .loss(&token_batch(batch), &batch.labels, &LoraContext::EVAL)
        .unwrap();
    out.sum.to_scalar::<f32>().unwrap() as f64
}

#[test]
fn packed_loss_is_the_sum_of_the_samples_losses() {
    let mut model = Gemma4Model::load(
        repo().join("assets/tiny").to_str().unwrap(),
        DType::F32,
        &Device::Cpu,
    )
    .unwrap();
    // a non-zero adapter, so the LoRA path is part of what is compared
    let mut cfg = LoraConfig::new(
        4,
        8.0,
        TargetModules::Regex(".*(q_proj|v_proj|down_proj)".into()),
    );
    cfg.init_lora_weights = InitLoraWeights::Random;
    g4ft_lora::attach(&cfg, model.projections_mut(), 7).unwrap();
    let ds = dataset();
    let collate = PadCollate {
        pad_id: ds.pad_id(),
    };
    // The loader's own packing plan: rows of up to 256 tokens, several samples each.
    let loader = DataLoader::new(
        Arc::clone(&ds),
        LoaderConfig {
            batch_size: 2,
            batching: Batching::Packed { pack_len: 256 },
            ..Default::default()
        },
    )
    .unwrap();
    let plan = loader.plan(0, 0);
    let rows = &plan[0];
    assert!(
        rows.iter().all(|r| r.len() >= 2),
        "each row packs several samples: {rows:?}"
    );
    let samples: Vec<Vec<(usize, Sample)>> = rows
        .iter()
        .map(|r| r.iter().map(|&i| (i, ds.sample(i).unwrap())).collect())
        .collect();
    assert!(samples
        .iter()
        .flatten()
        .any(|(_, s)| s.input_ids.len() > 16));
    let packed = collate.collate_packed(&samples);
    let bias = model.attention_bias(&token_batch(&packed)).unwrap();
    assert!(
        matches!(
            bias,
            AttentionBias::Causal {
                key_mask: None,
                seq_start: Some(_)
            }
        ),
        "a packed batch takes the fused attention with sequence starts: {bias:?}"
    );
    let got = loss_sum(&model, &packed);
    let alone: f64 = samples
        .iter()
        .flatten()
        .map(|(i, s)| loss_sum(&model, &collate.collate(&[(*i, s.clone())])))
        .sum();
    let rel = (got - alone).abs() / alone.abs();
    assert!(rel < 1e-5, "packed {got} vs alone {alone} (rel {rel:.2e})");
    // Without the position ids (an attention mask alone) the segments attend to each other.
    let mut masked = packed.clone();
    masked.position_ids = None;
    let leaked = loss_sum(&model, &masked);
    assert!(
        (leaked - alone).abs() / alone.abs() > 1e-3,
        "cross-sample attention must change the loss"
    );
    assert_eq!(
        packed.n_label_tokens,
        samples
            .iter()
            .flatten()
            .map(|(_, s)| g4ft_data::labels::count_targets(&s.labels))
            .sum::<usize>()
    );
}
