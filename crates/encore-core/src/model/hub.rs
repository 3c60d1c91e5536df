//! Models named as the Hugging Face Hub names them: `org/name` (a safetensors repository),
//! `org/name:QUANT` (the GGUF file of that quantization in the repository, e.g.
//! `Q4_K_M`) or `org/name:FILE.gguf`, at a revision (a branch, a tag or a commit; `main`
//! by default). A model resolves from the local Hugging Face cache, in the layout
//! `huggingface_hub` writes (`models--org--name/refs/REVISION` holding a commit,
//! `snapshots/COMMIT/FILES`), when its files are there or when `HF_HUB_OFFLINE` is set;
//! otherwise the missing files are downloaded into the cache through the `hf-hub` crate,
//! with a progress bar per file (`HF_TOKEN` or the saved login for gated models,
//! `HF_ENDPOINT` for a mirror). The cache is `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
//! `~/.cache/huggingface/hub`.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// A model named by its Hub id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HubId {
    /// `org/name`.
    pub repo: String,
    /// After the `:`: a GGUF quantization (`Q4_K_M`) or file name (`x.gguf`).
    pub pick: Option<String>,
}

impl HubId {
    /// `spec` as a Hub id, when it reads as one (`org/name` or `org/name:PICK`, each part
    /// of letters, digits, `-`, `_` and `.`, not starting with `.`); a path that exists is
    /// never one.
    pub fn parse(spec: &str) -> Option<HubId> {
        if Path::new(spec).exists() {
            return None;
        }
        let (repo, pick) = match spec.split_once(':') {
            Some((r, p)) if !p.is_empty() => (r, Some(p)),
            Some(_) => return None,
            None => (spec, None),
        };
        let (org, name) = repo.split_once('/')?;
        let part = |s: &str| {
            !s.is_empty()
                && !s.starts_with('.')
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        };
        if !part(org) || !part(name) || pick.is_some_and(|p| p.contains('/')) {
            return None;
        }
        Some(HubId {
            repo: repo.to_string(),
            pick: pick.map(str::to_string),
        })
    }

    /// The cache folder of the repository (`models--org--name`).
    fn folder(&self) -> String {
        format!("models--{}", self.repo.replace('/', "--"))
    }
}

impl std::fmt::Display for HubId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.pick {
            Some(p) => write!(f, "{}:{p}", self.repo),
            None => f.write_str(&self.repo),
        }
    }
}

/// Where models are looked up and downloaded to, whether downloading is allowed, and
/// from where (`None`: huggingface.co).
#[derive(Clone, Debug)]
pub struct HubCache {
    pub dir: PathBuf,
    pub offline: bool,
    pub endpoint: Option<String>,
}

impl HubCache {
    /// The cache the environment names (`HF_HUB_CACHE`, `HF_HOME`, the home directory),
    /// offline when `HF_HUB_OFFLINE` is `1`, `true`, `yes` or `on`, downloading from
    /// `HF_ENDPOINT` when set (a mirror).
    pub fn from_env() -> HubCache {
        let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
        let dir = match (var("HF_HUB_CACHE"), var("HF_HOME"), var("HOME")) {
            (Some(c), _, _) => PathBuf::from(c),
            (None, Some(h), _) => PathBuf::from(h).join("hub"),
            (None, None, Some(home)) => PathBuf::from(home).join(".cache/huggingface/hub"),
            (None, None, None) => PathBuf::from(".cache/huggingface/hub"),
        };
        let offline = std::env::var("HF_HUB_OFFLINE").is_ok_and(|v| {
            matches!(
                v.trim().to_ascii_lowercase().as_str(),
                "1" | "true" | "yes" | "on"
            )
        });
        let endpoint = std::env::var("HF_ENDPOINT").ok().filter(|e| !e.is_empty());
        HubCache {
            dir,
            offline,
            endpoint,
        }
    }

    /// The local path of `id` at `revision`: the snapshot directory of a safetensors
    /// model, or the picked GGUF file. Files missing from the cache are downloaded unless
    /// offline; an error names what is missing and where it looked.
    pub fn resolve(&self, id: &HubId, revision: &str) -> Result<PathBuf> {
        let found = self.find(id, revision);
        let found = match found {
            Err(local) if !self.offline => self
                .download(id, revision)
                .map_err(|e| format!("{local}; downloading it failed: {e}")),
            found => found,
        };
        found.map_err(|e| Error::invalid("model", e))
    }

    /// [`HubCache::resolve`] from the cache alone.
    pub fn local(&self, id: &HubId, revision: &str) -> Result<PathBuf> {
        self.find(id, revision)
            .map_err(|e| Error::invalid("model", e))
    }

    fn find(&self, id: &HubId, revision: &str) -> std::result::Result<PathBuf, String> {
        let repo_dir = self.dir.join(id.folder());
        let missing = |what: String| {
            format!(
                "{id} (revision {revision}): {what} in the Hugging Face cache at {}",
                self.dir.display()
            )
        };
        if !repo_dir.is_dir() {
            return Err(missing(format!("no repository {}", id.repo)));
        }
        let snapshot = snapshot_dir(&repo_dir, revision)
            .ok_or_else(|| missing(format!("no revision `{revision}`")))?;
        let files = list_files(&snapshot);
        match &id.pick {
            Some(pick) => {
                let gguf = pick_gguf(&files, pick).map_err(&missing)?;
                Ok(snapshot.join(gguf))
            }
            None => {
                let absent = missing_model_files(&snapshot, &files);
                if absent.is_empty() {
                    return Ok(snapshot);
                }
                let ggufs: Vec<&String> = files.iter().filter(|f| f.ends_with(".gguf")).collect();
                let hint = if ggufs.is_empty() {
                    String::new()
                } else {
                    format!(
                        " (it holds GGUF files {ggufs:?}: name one as {}:QUANT)",
                        id.repo
                    )
                };
                Err(missing(format!("missing {}{hint}", absent.join(", "))))
            }
        }
    }

    /// Download what `id` needs at `revision` into the cache (a progress bar per file) and
    /// return its local path; the error says why.
    fn download(&self, id: &HubId, revision: &str) -> std::result::Result<PathBuf, String> {
        use hf_hub::api::sync::ApiBuilder;
        use hf_hub::{Cache, Repo, RepoType};
        let cache = Cache::new(self.dir.clone());
        // A gated model needs a token: `HF_TOKEN`, else the one `huggingface-cli login`
        // saved beside the cache.
        let token = std::env::var("HF_TOKEN")
            .ok()
            .filter(|t| !t.is_empty())
            .or_else(|| cache.token());
        let mut api = ApiBuilder::from_cache(cache)
            .with_token(token)
            .with_progress(true);
        if let Some(endpoint) = &self.endpoint {
            api = api.with_endpoint(endpoint.trim_end_matches('/').to_string());
        }
        let api = api.build().map_err(|e| e.to_string())?;
        let repo = api.repo(Repo::with_revision(
            id.repo.clone(),
            RepoType::Model,
            revision.to_string(),
        ));
        let info = repo.info().map_err(|e| e.to_string())?;
        let names: Vec<String> = info.siblings.into_iter().map(|s| s.rfilename).collect();
        let get = |name: &str| repo.get(name).map_err(|e| format!("{name}: {e}"));
        if let Some(pick) = &id.pick {
            get(&pick_gguf(&names, pick).map_err(|e| format!("{e} on the Hub"))?)?;
            return self.find(id, revision);
        }
        let has = |n: &str| names.iter().any(|x| x == n);
        if !has("config.json") {
            return Err(format!(
                "the repository has no config.json (a GGUF repository? name a file as {}:QUANT)",
                id.repo
            ));
        }
        for name in names
            .iter()
            .filter(|n| is_model_file(n) && !n.ends_with(".safetensors"))
        {
            get(name)?;
        }
        // The weights: the shards the index names, else `model.safetensors`, else every
        // safetensors file (never a second copy in another layout beside them).
        let weights: Vec<String> = if has("model.safetensors.index.json") {
            let index = std::fs::read_to_string(get("model.safetensors.index.json")?)
                .map_err(|e| format!("model.safetensors.index.json: {e}"))?;
            index_shards(&index).into_iter().collect()
        } else if has("model.safetensors") {
            vec!["model.safetensors".into()]
        } else {
            names
                .iter()
                .filter(|n| is_model_file(n) && n.ends_with(".safetensors"))
                .cloned()
                .collect()
        };
        for name in &weights {
            get(name)?;
        }
        self.find(id, revision)
    }
}

/// The snapshot directory of `revision` in a repository's cache folder: the commit its
/// ref names, or the revision itself when it is a snapshot (a commit hash).
fn snapshot_dir(repo_dir: &Path, revision: &str) -> Option<PathBuf> {
    let snapshots = repo_dir.join("snapshots");
    if let Ok(commit) = std::fs::read_to_string(repo_dir.join("refs").join(revision)) {
        let dir = snapshots.join(commit.trim());
        if dir.is_dir() {
            return Some(dir);
        }
    }
    let dir = snapshots.join(revision);
    (!revision.contains('/') && dir.is_dir()).then_some(dir)
}

/// The files below `dir`, as paths relative to it with `/`, sorted.
fn list_files(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if !p.exists() {
                // A link to a blob that is not there (an interrupted download).
                continue;
            } else if let Ok(rel) = p.strip_prefix(dir) {
                out.push(rel.to_string_lossy().replace('\\', "/"));
            }
        }
    }
    out.sort();
    out
}

/// The GGUF file of `files` that `pick` names: a file name (ending in `.gguf`), or a
/// quantization matched case-insensitively as a whole part of the name (`Q4_K_M` in
/// `model-Q4_K_M.gguf`, not in `model-Q4_K_M_L.gguf`); of a split file, its first part.
fn pick_gguf(files: &[String], pick: &str) -> std::result::Result<String, String> {
    let ggufs: Vec<&String> = files.iter().filter(|f| f.ends_with(".gguf")).collect();
    let found: Vec<&String> = if pick.ends_with(".gguf") {
        ggufs
            .iter()
            .copied()
            .filter(|f| *f == pick || f.rsplit('/').next() == Some(pick))
            .collect()
    } else {
        let q = pick.to_ascii_lowercase();
        ggufs
            .iter()
            .copied()
            .filter(|f| {
                let stem = f.rsplit('/').next().unwrap_or(f).to_ascii_lowercase();
                let stem = stem.trim_end_matches(".gguf");
                stem.split(['-', '.']).any(|part| part == q)
            })
            .filter(|f| !f.contains("-of-") || f.contains("-00001-of-"))
            .collect()
    };
    match found.as_slice() {
        [one] => Ok((*one).clone()),
        [] => Err(format!(
            "no GGUF file {} (GGUF files there: {ggufs:?})",
            if pick.ends_with(".gguf") {
                format!("named {pick}")
            } else {
                format!("of quantization {pick}")
            }
        )),
        many => Err(format!(
            "{} GGUF files match {pick}: {many:?}; name one",
            many.len()
        )),
    }
}

/// Whether a repository file belongs to a safetensors model's download: its config,
/// tokenizer, chat template, generation config and weights.
fn is_model_file(name: &str) -> bool {
    let base = name.rsplit('/').next().unwrap_or(name);
    !name.contains('/')
        && (base.ends_with(".safetensors")
            || base == "model.safetensors.index.json"
            || matches!(
                base,
                "config.json"
                    | "generation_config.json"
                    | "tokenizer.json"
                    | "tokenizer_config.json"
                    | "special_tokens_map.json"
                    | "chat_template.jinja"
                    | "chat_template.json"
            ))
}

/// What a safetensors snapshot lacks to be loaded: `config.json`, `tokenizer.json`, and
/// its weights (every shard its index names, or `model.safetensors`).
fn missing_model_files(snapshot: &Path, files: &[String]) -> Vec<String> {
    let has = |f: &str| files.iter().any(|x| x == f);
    let mut absent: Vec<String> = ["config.json", "tokenizer.json"]
        .into_iter()
        .filter(|f| !has(f))
        .map(str::to_string)
        .collect();
    let index = snapshot.join("model.safetensors.index.json");
    if let Ok(text) = std::fs::read_to_string(&index) {
        absent.extend(index_shards(&text).into_iter().filter(|s| !has(s)));
    } else if !files.iter().any(|f| f.ends_with(".safetensors")) {
        absent.push("model.safetensors".into());
    }
    absent
}

/// The shard files a `model.safetensors.index.json` names (its `weight_map` values).
fn index_shards(index: &str) -> std::collections::BTreeSet<String> {
    serde_json::from_str::<serde_json::Value>(index)
        .ok()
        .and_then(|v| {
            v.get("weight_map")?.as_object().map(|m| {
                m.values()
                    .filter_map(|s| s.as_str().map(str::to_string))
                    .collect()
            })
        })
        .unwrap_or_default()
}
