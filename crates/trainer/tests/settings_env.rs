//! The environment layer of the settings: `MODEL_ID` / `DATA_PATH` / `OUTPUT_DIR` beat the
//! `--config` file and lose to flags; an empty variable counts as unset. Its own test binary with
//! one test, because it sets process environment variables that every parse reads.

use std::path::{Path, PathBuf};

use g4ft_trainer::config::cli::resolve_args;
use g4ft_trainer::config::Origin;

#[test]
fn env_beats_file_and_flag_beats_env() {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/tiny-cpu.toml");
    // SAFETY: the only test of this binary; nothing else reads the environment concurrently.
    unsafe {
        std::env::set_var("MODEL_ID", "env-model");
        std::env::set_var("OUTPUT_DIR", "env-out");
        std::env::set_var("DATA_PATH", "");
    }
    let r = resolve_args([
        "t",
        "--config",
        file.to_str().unwrap(),
        "--output",
        "flag-out",
    ])
    .unwrap();
    assert_eq!(r.config.model, "env-model", "env beats file");
    assert_eq!(r.origin("model"), Origin::Env("MODEL_ID".into()));
    assert_eq!(r.config.output, PathBuf::from("flag-out"), "flag beats env");
    assert_eq!(r.origin("output"), Origin::Flag);
    assert_eq!(
        r.config.data,
        PathBuf::from("assets/sample/chat.jsonl"),
        "an empty DATA_PATH leaves the file's value"
    );
    assert_eq!(r.origin("data"), Origin::File(file.clone()));
    assert!(
        r.table().contains("env-model   ($MODEL_ID)"),
        "{}",
        r.table()
    );
}
