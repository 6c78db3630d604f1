//! Hub downloads against a server of our own on 127.0.0.1 that serves the tiny model in the Hub's
//! URL layout: every file a run needs, once per cache however many processes ask, the token of a
//! gated repository, `--revision`, the cache afterwards; paths with typos are not Hub ids.

mod common;

use std::path::Path;

use common::hub::HubServer;
use common::*;
use g4ft::data::{DataFiles, SplitChoice};
use g4ft::gemma4::{Hub, ModelFiles};

const REPO: &str = "g4ft-test/tiny";

fn hub(server: &HubServer, cache: &Path, token: Option<&str>) -> Hub {
    Hub {
        endpoint: Some(server.endpoint()),
        token: token.map(str::to_string),
        revision: None,
        cache_dir: Some(cache.to_path_buf()),
        offline: false,
    }
}

fn tiny() -> std::path::PathBuf {
    Path::new(ROOT).join("assets/tiny")
}

#[test]
fn a_hub_id_downloads_every_file_once_and_then_reads_the_cache() {
    let server = HubServer::start(&tiny(), REPO, Some("secret"));
    let cache = tmp("hub-cache");
    let h = hub(&server, &cache, Some("secret"));
    // Four processes' worth of concurrent lookups: one download of each file.
    let found: Vec<ModelFiles> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| s.spawn(|| ModelFiles::resolve_with(REPO, &h).unwrap()))
            .collect();
        handles.into_iter().map(|t| t.join().unwrap()).collect()
    });
    for f in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        "special_tokens_map.json",
    ] {
        assert_eq!(
            server.downloads(f),
            1,
            "{f}: {:?}",
            server.requests.lock().unwrap()
        );
    }
    let dir = found[0].config.parent().unwrap();
    assert!(dir.join("tokenizer.json").is_file() && dir.join("chat_template.jinja").is_file());
    assert!(found.iter().all(|f| f.config == found[0].config));
    // Offline afterwards: the cache alone.
    let n = server.requests.lock().unwrap().len();
    let offline = Hub {
        offline: true,
        ..h.clone()
    };
    let again = ModelFiles::resolve_with(REPO, &offline).unwrap();
    assert_eq!(again.weights, found[0].weights);
    assert_eq!(
        server.requests.lock().unwrap().len(),
        n,
        "no request when cached"
    );
    // A cache holding the weights but not the tokenizer (an older download) gets the missing
    // files only.
    std::fs::remove_file(dir.join("tokenizer.json")).unwrap();
    ModelFiles::resolve_with(REPO, &h).unwrap();
    assert!(dir.join("tokenizer.json").is_file());
    assert_eq!(server.downloads("tokenizer.json"), 2);
    assert_eq!(
        server.downloads("model.safetensors"),
        1,
        "the weights are not fetched again"
    );
}

#[test]
fn a_gated_repository_needs_the_token_and_the_error_says_so() {
    let server = HubServer::start(&tiny(), REPO, Some("secret"));
    let cache = tmp("hub-gated");
    let msg = ModelFiles::resolve_with(REPO, &hub(&server, &cache, None))
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("config.json") && msg.contains("401") && msg.contains("HF_TOKEN"),
        "{msg}"
    );
    let msg = ModelFiles::resolve_with(REPO, &hub(&server, &cache, Some("wrong")))
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("check that the token may read this repository"),
        "{msg}"
    );
}

#[test]
fn revision_selects_the_url_and_the_cache_entry() {
    let server = HubServer::start(&tiny(), REPO, None);
    let cache = tmp("hub-rev");
    let h = Hub {
        revision: Some("v2".into()),
        ..hub(&server, &cache, None)
    };
    ModelFiles::resolve_with(REPO, &h).unwrap();
    let reqs = server.requests.lock().unwrap().clone();
    assert!(
        !reqs.is_empty() && reqs.iter().all(|r| r.path.contains("/resolve/v2/")),
        "{reqs:?}"
    );
    let main = Hub {
        revision: None,
        offline: true,
        ..h
    };
    assert!(
        ModelFiles::resolve_with(REPO, &main).is_err(),
        "main is not cached"
    );
}

#[test]
fn a_missing_path_is_not_taken_for_a_hub_id() {
    let server = HubServer::start(&tiny(), REPO, None);
    let cache = tmp("hub-typo");
    for (model, says) in [
        ("assets/tinyy", "`assets` is a local directory"),
        ("./tiny", "starts like a path"),
        ("models/gemma/tiny", "exactly one `/`"),
    ] {
        let msg = ModelFiles::resolve_with(model, &hub(&server, &cache, None))
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("no such directory") && msg.contains(says),
            "{model}: {msg}"
        );
    }
    assert!(
        server.requests.lock().unwrap().is_empty(),
        "nothing was looked up"
    );
}

/// A one-step run of the tiny model given as the Hub id.
fn hub_args(out: &Path) -> Vec<String> {
    let mut args = args_with(
        out,
        &["--max-steps", "1", "--micro-batch", "1", "--accum", "2"],
    );
    let i = args.iter().position(|a| a == "--model").unwrap();
    args[i + 1] = REPO.into();
    args
}

#[test]
fn train_ddp_on_two_ranks_downloads_once_with_hf_token() {
    let server = HubServer::start(&tiny(), REPO, Some("secret"));
    let home = tmp("hub-home");
    let out = tmp("hub-train");
    let args = hub_args(&out);
    let endpoint = server.endpoint();
    let env = [
        ("HF_ENDPOINT", endpoint.as_str()),
        ("HF_HOME", home.to_str().unwrap()),
        ("HF_TOKEN", "secret"),
    ];
    let log = run_ok(2, &args, &env);
    assert!(log.contains("adapter identical on all 2 ranks"), "{log}");
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        assert_eq!(server.downloads(f), 1, "{f}");
    }
    // HUGGING_FACE_HUB_TOKEN works too; a second run finds everything in the cache.
    let n = server.requests.lock().unwrap().len();
    let env = [
        ("HF_ENDPOINT", endpoint.as_str()),
        ("HF_HOME", home.to_str().unwrap()),
        ("HUGGING_FACE_HUB_TOKEN", "secret"),
    ];
    run_ok(1, &hub_args(&tmp("hub-train-2")), &env);
    assert_eq!(server.requests.lock().unwrap().len(), n);
}

const DATASET: &str = "g4ft-test/chat";

/// A dataset repository in the layout `push_to_hub` writes: a card listing one config whose
/// `train` split is the fixture's 12 rows in two shards and whose `test` split is the whole file,
/// and a file no split names.
fn dataset_repo(name: &str) -> std::path::PathBuf {
    let dir = tmp(name);
    std::fs::create_dir_all(dir.join("data")).unwrap();
    std::fs::create_dir_all(dir.join("raw")).unwrap();
    let rows = std::fs::read_to_string(fixture("data.jsonl")).unwrap();
    let lines: Vec<&str> = rows.lines().collect();
    for (i, part) in lines.chunks(6).enumerate() {
        let shard = dir.join(format!("data/train-{i:05}-of-00002.jsonl"));
        std::fs::write(shard, part.join("\n") + "\n").unwrap();
    }
    std::fs::write(dir.join("data/test-00000-of-00001.jsonl"), &rows).unwrap();
    std::fs::write(dir.join("raw/unused.jsonl"), &rows).unwrap();
    let card = "---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n    \
                path: data/train-*\n  - split: test\n    path: data/test-*\n---\n# chat rows\n";
    std::fs::write(dir.join("README.md"), card).unwrap();
    dir
}

#[test]
fn a_hub_dataset_id_downloads_its_split_once_and_then_reads_the_cache() {
    let server = HubServer::start_dataset(&dataset_repo("hub-dataset"), DATASET);
    let cache = tmp("hub-dataset-cache");
    let h = hub(&server, &cache, None);
    let train = DataFiles::resolve(DATASET, SplitChoice::train(None), &h).unwrap();
    assert_eq!(
        (train.config.as_deref(), train.split.as_deref()),
        (Some("default"), Some("train"))
    );
    assert_eq!(
        train.describe(),
        format!("{DATASET} (config default, split train, 2 files)")
    );
    assert!(train.files[1].ends_with("data/train-00001-of-00002.jsonl"));
    for (file, n) in [
        ("README.md", 1),
        ("train-00000-of-00002.jsonl", 1),
        ("train-00001-of-00002.jsonl", 1),
        ("test-00000-of-00001.jsonl", 0),
        ("unused.jsonl", 0),
    ] {
        assert_eq!(server.downloads(file), n, "{file}");
    }
    // Again, and offline: from the cache, without a request.
    let n = server.requests.lock().unwrap().len();
    assert_eq!(
        DataFiles::resolve(DATASET, SplitChoice::train(None), &h).unwrap(),
        train
    );
    let offline = Hub {
        offline: true,
        ..h.clone()
    };
    let again = DataFiles::resolve(DATASET, SplitChoice::train(None), &offline).unwrap();
    assert_eq!(again, train);
    assert_eq!(server.requests.lock().unwrap().len(), n);
    // A split not downloaded yet: offline says so, online fetches its file only.
    let err = DataFiles::resolve(DATASET, SplitChoice::eval(None), &offline).unwrap_err();
    assert!(
        err.to_string().contains("not all in the Hub cache"),
        "{err}"
    );
    let test = DataFiles::resolve(DATASET, SplitChoice::eval(None), &h).unwrap();
    assert_eq!(test.split.as_deref(), Some("test"));
    assert_eq!(server.downloads("test-00000-of-00001.jsonl"), 1);
    assert_eq!(server.downloads("unused.jsonl"), 0);
    // A split the card does not list names the ones it does.
    let err = DataFiles::resolve(DATASET, SplitChoice::train(Some("dev")), &h).unwrap_err();
    assert!(
        err.to_string().contains(
            "no split `dev` here in config `default`: the files make the splits train, test"
        ),
        "{err}"
    );
    // An id the Hub does not have.
    let err = DataFiles::resolve("g4ft-test/none", SplitChoice::train(None), &h).unwrap_err();
    assert!(
        err.to_string().contains("no such dataset on the Hub"),
        "{err}"
    );
}

#[test]
fn train_ddp_on_two_ranks_trains_a_hub_dataset_downloaded_once() {
    let server = HubServer::start_dataset(&dataset_repo("hub-dataset-train"), DATASET);
    let home = tmp("hub-dataset-home");
    let out = tmp("hub-dataset-train-out");
    let mut args = args_with(
        &out,
        &["--max-steps", "2", "--micro-batch", "1", "--accum", "2"],
    );
    let i = args.iter().position(|a| a == "--data").unwrap();
    args[i + 1] = DATASET.into();
    let endpoint = server.endpoint();
    let env = [
        ("HF_ENDPOINT", endpoint.as_str()),
        ("HF_HOME", home.to_str().unwrap()),
    ];
    let log = run_ok(2, &args, &env);
    assert!(
        log.contains(&format!(
            "dataset {DATASET} (config default, split train, 2 files)"
        )),
        "{log}"
    );
    for f in [
        "train-00000-of-00002.jsonl",
        "train-00001-of-00002.jsonl",
        "README.md",
    ] {
        assert_eq!(server.downloads(f), 1, "{f}");
    }
    let record = &metrics(&out, "dataset")[0];
    assert_eq!(
        (
            &record["data_config"],
            &record["data_split"],
            &record["rows"]
        ),
        (&"default".into(), &"train".into(), &12.into())
    );
}
