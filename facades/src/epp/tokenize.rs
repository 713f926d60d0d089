//! The configured models' tokenizers (`serve --epp-model NAME=PATH/tokenizer.json`).
//!
//! Block hashes only agree with what an engine cached if the picker tokenizes as the engine
//! did, so each model names its own Hugging Face `tokenizer.json`. The text is encoded with the
//! tokenizer's special tokens (its post-processor, e.g. a BOS token), as vLLM encodes a
//! `/v1/completions` prompt.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokenizers::Tokenizer;

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("--epp-model wants NAME=PATH/tokenizer.json, got {0:?}")]
    Spec(String),
    #[error("loading the tokenizer of model {model} from {path}: {reason}")]
    Load { model: String, path: PathBuf, reason: String },
    #[error("model {0} is named twice")]
    Duplicate(String),
    #[error("tokenizing for model {model}: {reason}")]
    Encode { model: String, reason: String },
}

/// Parses one `NAME=PATH` flag value.
pub fn parse_spec(s: &str) -> Result<(String, PathBuf), TokenizerError> {
    match s.split_once('=') {
        Some((name, path)) if !name.is_empty() && !path.is_empty() => Ok((name.into(), path.into())),
        _ => Err(TokenizerError::Spec(s.into())),
    }
}

/// Model name → tokenizer. Cheap to clone.
#[derive(Clone, Default)]
pub struct Tokenizers {
    by_model: HashMap<String, Arc<Tokenizer>>,
}

impl Tokenizers {
    /// Loads every `(model, tokenizer.json)`; any unreadable file fails the start.
    pub fn load(models: &[(String, PathBuf)]) -> Result<Self, TokenizerError> {
        let mut by_model = HashMap::new();
        for (model, path) in models {
            let t = load_one(model, path)?;
            if by_model.insert(model.clone(), Arc::new(t)).is_some() {
                return Err(TokenizerError::Duplicate(model.clone()));
            }
        }
        Ok(Self { by_model })
    }

    /// Whether `model` is served (has a tokenizer).
    pub fn knows(&self, model: &str) -> bool {
        self.by_model.contains_key(model)
    }

    /// The served models, sorted (messages).
    pub fn models(&self) -> Vec<&str> {
        let mut m: Vec<&str> = self.by_model.keys().map(String::as_str).collect();
        m.sort_unstable();
        m
    }

    /// `text`'s token ids under `model`'s tokenizer, off the async threads (a long prompt is
    /// milliseconds of CPU). None: the model has no tokenizer.
    pub async fn encode(&self, model: &str, text: String) -> Option<Result<Vec<u32>, TokenizerError>> {
        let t = self.by_model.get(model)?.clone();
        let model = model.to_string();
        let r = tokio::task::spawn_blocking(move || {
            t.encode(text, true).map(|e| e.get_ids().to_vec()).map_err(|e| e.to_string())
        })
        .await;
        let r = match r {
            Ok(r) => r,
            Err(e) => Err(e.to_string()),
        };
        Some(r.map_err(|reason| TokenizerError::Encode { model, reason }))
    }
}

fn load_one(model: &str, path: &Path) -> Result<Tokenizer, TokenizerError> {
    Tokenizer::from_file(path).map_err(|e| TokenizerError::Load {
        model: model.into(),
        path: path.into(),
        reason: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_need_a_name_and_a_path() {
        assert_eq!(parse_spec("m=/t.json").unwrap(), ("m".into(), PathBuf::from("/t.json")));
        assert!(parse_spec("m").is_err());
        assert!(parse_spec("=p").is_err());
    }

    #[test]
    fn a_missing_file_fails_the_load() {
        let r = Tokenizers::load(&[("m".into(), "no/such/tokenizer.json".into())]);
        assert!(matches!(r, Err(TokenizerError::Load { .. })));
    }
}
