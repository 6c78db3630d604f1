//! A Hub dataset id (`owner/name`) as data: its files listed, one split chosen by the rules of
//! [`crate::files`] (its dataset card's `configs` first), that split's files downloaded into the
//! Hub cache once per cache (concurrent ranks wait for the first one's download, saying so).
//!
//! The file list is kept in the cache with the commit it came from; a later run whose split's
//! files are all cached makes no request, and `HF_HUB_OFFLINE=1` reads only the cache. As with a
//! model, a cached revision is not checked for newer commits: pass another revision to move on.

use g4ft_hub::{Hub, HubRepo, Listing, RepoKind};

use crate::error::{DataError, Result};
use crate::files::{choose_split, DataFiles, SplitChoice};

/// The name of a dataset card.
const CARD: &str = "README.md";

/// The files of the split `choice` takes from the Hub dataset `id`, in the Hub cache.
pub fn resolve_hub(id: &str, choice: SplitChoice, hub: &Hub) -> Result<DataFiles> {
    let err = |msg: String| DataError::DataFiles {
        spec: id.to_string(),
        msg,
    };
    let repo = HubRepo::new(id, RepoKind::Dataset, hub);
    if let Some((listing, card)) = repo
        .cached_listing()
        .and_then(|l| cached_card(&repo, &l).map(|card| (l, card)))
    {
        match choose_split(&listing.files, card.as_deref(), choice) {
            Ok((config, split, rel)) => {
                let cached: Option<Vec<_>> = rel.iter().map(|f| repo.cached(f)).collect();
                if let Some(files) = cached {
                    return Ok(data_files(id, config, split, files));
                }
            }
            Err(msg) if repo.offline() => return Err(err(msg)),
            Err(_) => {}
        }
    }
    if repo.offline() {
        return Err(err(format!(
            "the split's files are not all in the Hub cache {} and HF_HUB_OFFLINE=1",
            repo.cache_dir().display()
        )));
    }
    // One download per cache: the first process takes the lock, the others wait for it and
    // then find the listing and the files in the cache.
    let _lock = repo.lock().map_err(|e| err(e.msg))?;
    let remote = repo.connect().map_err(|e| err(e.msg))?;
    let listing = remote.files().map_err(|e| {
        err(match e.missing {
            true => format!(
                "no such dataset on the Hub ({}), and no such local file or folder",
                e.msg
            ),
            false => e.msg,
        })
    })?;
    let card = match listing.files.iter().any(|f| f == CARD) {
        true => {
            let path = remote.fetch(CARD).map_err(|e| err(e.msg))?;
            Some(std::fs::read_to_string(&path).map_err(|e| DataError::io(&path, e))?)
        }
        false => None,
    };
    repo.save_listing(&listing).map_err(|e| err(e.msg))?;
    let (config, split, rel) =
        choose_split(&listing.files, card.as_deref(), choice).map_err(err)?;
    let files = rel
        .iter()
        .map(|f| remote.fetch(f).map_err(|e| err(e.msg)))
        .collect::<Result<Vec<_>>>()?;
    Ok(data_files(id, config, split, files))
}

/// The dataset card of a cached listing: `Some(None)` when the listing has none, `None` when it
/// has one that the cache does not hold (the listing alone cannot then say which files a split
/// has).
fn cached_card(repo: &HubRepo, listing: &Listing) -> Option<Option<String>> {
    if !listing.files.iter().any(|f| f == CARD) {
        return Some(None);
    }
    let text = std::fs::read_to_string(repo.cached(CARD)?).ok()?;
    Some(Some(text))
}

fn data_files(
    id: &str,
    config: Option<String>,
    split: String,
    files: Vec<std::path::PathBuf>,
) -> DataFiles {
    DataFiles {
        spec: id.to_string(),
        config,
        split: Some(split),
        files,
    }
}
