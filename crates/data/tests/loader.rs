//! Dataset cache, loader plans and batches on the bundled sample data.

mod common;

use std::sync::Arc;

use g4ft_data::{
    Batching, DataLoader, DatasetOptions, Encoder, LabelMode, LoaderConfig, PrepareOptions,
    TokenDataset,
};

fn dataset(name: &str, mode: LabelMode) -> Arc<TokenDataset> {
    let enc = Encoder::from_model_dir(&common::tiny()).unwrap();
    let dir = common::scratch(name);
    let opts = DatasetOptions {
        prepare: PrepareOptions {
            max_len: 96,
            label_mode: mode,
            ..Default::default()
        },
        cache_dir: Some(dir.join("cache")),
        ..Default::default()
    };
    let path = common::repo().join("assets/sample/chat.jsonl");
    Arc::new(TokenDataset::open(&path, Some(&enc), &opts).unwrap())
}

#[test]
fn cache_is_reused_and_keyed() {
    let enc = Encoder::from_model_dir(&common::tiny()).unwrap();
    let dir = common::scratch("cache-key");
    let path = common::repo().join("assets/sample/chat.jsonl");
    let data = dir.join("chat.jsonl");
    std::fs::copy(&path, &data).unwrap();
    let opts = DatasetOptions {
        cache_dir: Some(dir.join("c")),
        ..Default::default()
    };
    let a = TokenDataset::open(&data, Some(&enc), &opts).unwrap();
    let b = TokenDataset::open(&data, Some(&enc), &opts).unwrap();
    assert!(!a.from_cache() && b.from_cache());
    assert_eq!(a.cache_paths(), b.cache_paths());
    assert_eq!(a.sample(7).unwrap(), b.sample(7).unwrap());
    let other = DatasetOptions {
        prepare: PrepareOptions {
            label_mode: LabelMode::AssistantOnly,
            ..Default::default()
        },
        ..opts.clone()
    };
    let c = TokenDataset::open(&data, Some(&enc), &other).unwrap();
    assert!(!c.from_cache() && c.cache_paths() != a.cache_paths());
    // editing the data file invalidates the cache
    let mut text = std::fs::read_to_string(&data).unwrap();
    text.push_str(r#"{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}"#);
    text.push('\n');
    std::fs::write(&data, text).unwrap();
    let d = TokenDataset::open(&data, Some(&enc), &opts).unwrap();
    assert!(!d.from_cache());
    assert_eq!(d.len(), a.len() + 1);
}

#[test]
fn concurrent_opens_share_one_build() {
    let enc = Arc::new(Encoder::from_model_dir(&common::tiny()).unwrap());
    let dir = common::scratch("cache-race");
    let path = common::repo().join("assets/sample/chat.jsonl");
    let opts = DatasetOptions {
        cache_dir: Some(dir.join("c")),
        ..Default::default()
    };
    let built: Vec<bool> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    !TokenDataset::open(&path, Some(&enc), &opts)
                        .unwrap()
                        .from_cache()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(
        built.iter().filter(|&&b| b).count(),
        1,
        "exactly one opener tokenizes: {built:?}"
    );
}

#[test]
fn assistant_only_labels_cover_only_model_turns() {
    let ds = dataset("labels", LabelMode::AssistantOnly);
    let enc = Encoder::from_model_dir(&common::tiny()).unwrap();
    let turn_end = enc.tokenizer().token_to_id("<turn|>").unwrap();
    for i in 0..ds.len() {
        let s = ds.sample(i).unwrap();
        let trained: Vec<u32> = s
            .input_ids
            .iter()
            .zip(&s.labels)
            .filter(|(_, &l)| l != -100)
            .map(|(&t, _)| t)
            .collect();
        let text = enc.tokenizer().decode(&trained, false).unwrap();
        assert!(
            !text.contains("<|turn>") && !text.contains("user"),
            "sample {i}: {text:?}"
        );
        if s.input_ids.len() < 96 {
            assert_eq!(
                trained.last(),
                Some(&turn_end),
                "untruncated sample {i} ends its trained span with <turn|>"
            );
        }
        for (&t, &l) in s.input_ids.iter().zip(&s.labels) {
            assert!(l == -100 || l == t as i32);
        }
    }
}

#[test]
fn loader_len_plans_and_batches_agree_across_ranks() {
    let ds = dataset("loader", LabelMode::Full);
    for batching in [
        Batching::Plain,
        Batching::GroupByLength { mega_batch_mult: 4 },
        Batching::Packed { pack_len: 96 },
    ] {
        for (world, drop_last) in [(1, false), (3, false), (3, true), (4, true)] {
            let loaders: Vec<DataLoader> = (0..world)
                .map(|rank| {
                    let cfg = LoaderConfig {
                        batch_size: 4,
                        rank,
                        world_size: world,
                        seed: 11,
                        drop_last,
                        drop_last_batch: true,
                        batching,
                        prefetch: 2,
                        ..Default::default()
                    };
                    DataLoader::new(Arc::clone(&ds), cfg).unwrap()
                })
                .collect();
            let len = loaders[0].len();
            assert!(
                len > 0 && loaders.iter().all(|l| l.len() == len),
                "{batching:?} world {world}"
            );
            let mut seen = vec![0usize; ds.len()];
            for l in &loaders {
                let batches: Vec<_> = l.epoch(1, 0).map(|b| b.unwrap()).collect();
                assert_eq!(batches.len(), len);
                for b in &batches {
                    assert_eq!(b.input_ids.len(), b.batch * b.seq_len);
                    assert_eq!(b.batch, 4);
                    assert_eq!(
                        b.n_tokens,
                        b.attention_mask.iter().filter(|&&m| m == 1).count()
                    );
                    assert_eq!(
                        b.position_ids.is_some(),
                        matches!(batching, Batching::Packed { .. })
                    );
                    for &i in &b.samples {
                        seen[i] += 1;
                    }
                }
            }
            if !drop_last && world == 1 {
                let missing = seen.iter().filter(|&&c| c == 0).count();
                assert!(
                    missing < 4 * ds.len().div_ceil(100) + 4,
                    "{batching:?}: {missing} samples never seen"
                );
            }
            if !matches!(batching, Batching::Packed { .. }) {
                assert!(
                    seen.iter().all(|&c| c <= 1 + usize::from(!drop_last)),
                    "{batching:?}"
                );
            }
        }
    }
}

#[test]
fn length_grouping_reduces_padding_and_resume_skips() {
    let ds = dataset("grouping", LabelMode::Full);
    let cfg = LoaderConfig {
        batch_size: 8,
        world_size: 2,
        seed: 3,
        ..Default::default()
    };
    let padded = |batching| {
        let l = DataLoader::new(
            Arc::clone(&ds),
            LoaderConfig {
                batching,
                ..cfg.clone()
            },
        )
        .unwrap();
        l.epoch(0, 0)
            .map(|b| b.unwrap())
            .map(|b| b.batch * b.seq_len - b.n_tokens)
            .sum::<usize>()
    };
    let plain = padded(Batching::Plain);
    let grouped = padded(Batching::GroupByLength { mega_batch_mult: 8 });
    assert!(
        grouped * 2 < plain,
        "grouped padding {grouped} vs plain {plain}"
    );
    let l = DataLoader::new(Arc::clone(&ds), cfg).unwrap();
    let all: Vec<_> = l.epoch(2, 0).map(|b| b.unwrap().samples).collect();
    let resumed: Vec<_> = l.epoch(2, 5).map(|b| b.unwrap().samples).collect();
    assert_eq!(resumed, all[5..].to_vec());
    // dropping an iterator early stops its thread
    let mut it = l.epoch(3, 0);
    assert!(it.next().is_some());
    drop(it);
}
