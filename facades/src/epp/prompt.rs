//! The OpenAI request body → the model and the prompt the picker tokenizes (pure).
//!
//! `/v1/completions`: `prompt` is a string, a list of strings (the first is routed on: a batch
//! goes to one endpoint, and its first prompt's prefix is as good a guide as any), or token ids
//! (used as they are, no tokenizer). `/v1/chat/completions`: `messages`, whose contents are
//! joined in order with one `\n` between messages; a content given as parts contributes its
//! `text` parts, joined with `\n`. That rendering is deterministic and prefix-stable (a longer
//! conversation starts with the text of its shorter self) but it is not the model's chat
//! template, so it agrees with an engine's own tokens only as far as the template leaves the
//! text alone: a mismatch loses matches, it never invents one.

use serde_json::Value;

/// What the picker routes on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ask {
    pub model: String,
    pub prompt: Prompt,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
}

/// Why a body cannot be routed on (answered 400).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BodyError {
    #[error("the request body is not JSON: {0}")]
    Json(String),
    #[error("the request body has no string `model`")]
    NoModel,
    #[error("the request body has neither `prompt` nor `messages`")]
    NoPrompt,
    #[error("`{0}` has an unsupported shape")]
    Shape(&'static str),
}

/// The model and prompt of an OpenAI completions or chat completions body.
pub fn parse(body: &[u8]) -> Result<Ask, BodyError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| BodyError::Json(e.to_string()))?;
    let model = v.get("model").and_then(Value::as_str).ok_or(BodyError::NoModel)?.to_string();
    let prompt = match (v.get("prompt"), v.get("messages")) {
        (Some(p), _) => completion_prompt(p)?,
        (None, Some(m)) => Prompt::Text(chat_text(m)?),
        (None, None) => return Err(BodyError::NoPrompt),
    };
    Ok(Ask { model, prompt })
}

fn completion_prompt(p: &Value) -> Result<Prompt, BodyError> {
    match p {
        Value::String(s) => Ok(Prompt::Text(s.clone())),
        Value::Array(items) => match items.first() {
            None => Ok(Prompt::Text(String::new())),
            Some(Value::String(s)) => Ok(Prompt::Text(s.clone())),
            Some(Value::Number(_)) => token_ids(items).map(Prompt::Tokens),
            // A batch of token-id lists: the first.
            Some(Value::Array(first)) => token_ids(first).map(Prompt::Tokens),
            Some(_) => Err(BodyError::Shape("prompt")),
        },
        _ => Err(BodyError::Shape("prompt")),
    }
}

fn token_ids(items: &[Value]) -> Result<Vec<u32>, BodyError> {
    items
        .iter()
        .map(|t| t.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or(BodyError::Shape("prompt")))
        .collect()
}

fn chat_text(messages: &Value) -> Result<String, BodyError> {
    let list = messages.as_array().ok_or(BodyError::Shape("messages"))?;
    let mut out = Vec::with_capacity(list.len());
    for m in list {
        out.push(message_text(m.get("content").unwrap_or(&Value::Null))?);
    }
    Ok(out.join("\n"))
}

fn message_text(content: &Value) -> Result<String, BodyError> {
    match content {
        // An assistant message with tool calls only has no content.
        Value::Null => Ok(String::new()),
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let texts: Vec<&str> = parts
                .iter()
                .filter(|p| p.get("type").and_then(Value::as_str) == Some("text"))
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect();
            Ok(texts.join("\n"))
        }
        _ => Err(BodyError::Shape("messages")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn p(v: Value) -> Result<Ask, BodyError> {
        parse(v.to_string().as_bytes())
    }

    #[test]
    fn completions_prompts() {
        let a = p(json!({"model": "m", "prompt": "hello world"})).unwrap();
        assert_eq!(a, Ask { model: "m".into(), prompt: Prompt::Text("hello world".into()) });
        assert_eq!(
            p(json!({"model": "m", "prompt": ["a b", "c"]})).unwrap().prompt,
            Prompt::Text("a b".into())
        );
        assert_eq!(
            p(json!({"model": "m", "prompt": [1, 2, 3]})).unwrap().prompt,
            Prompt::Tokens(vec![1, 2, 3])
        );
        assert_eq!(
            p(json!({"model": "m", "prompt": [[4, 5], [6]]})).unwrap().prompt,
            Prompt::Tokens(vec![4, 5])
        );
        assert_eq!(p(json!({"model": "m", "prompt": [-1]})), Err(BodyError::Shape("prompt")));
    }

    #[test]
    fn chat_contents_are_joined_in_order() {
        let a = p(json!({"model": "m", "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "one"}, {"type": "image_url"}, {"type": "text", "text": "two"}]},
            {"role": "assistant", "content": null}
        ]}))
        .unwrap();
        assert_eq!(a.prompt, Prompt::Text("be brief\none\ntwo\n".into()));
    }

    #[test]
    fn bodies_without_model_or_prompt_are_refused() {
        assert_eq!(p(json!({"prompt": "x"})), Err(BodyError::NoModel));
        assert_eq!(p(json!({"model": "m"})), Err(BodyError::NoPrompt));
        assert!(matches!(parse(b"{not json"), Err(BodyError::Json(_))));
    }
}
