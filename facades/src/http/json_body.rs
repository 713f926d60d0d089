//! [`UpstreamJson`]: the body extractor of Dynamo's routes. It accepts and refuses exactly what
//! axum's `Json` (upstream's extractor) does, with axum's own rejections, but parses the
//! common request (`Content-Type: application/json`, a body of the right shape) with
//! `serde_json` alone: axum's `Json` parses through `serde_path_to_error`, which tracks the
//! path of every element and cost a quarter of the replica's CPU on `/query` bodies of a few
//! hundred token ids. Anything else (another content type, a body that does not parse) goes to
//! axum's `Json`, so the error answers stay upstream's.

use axum::body::Bytes;
use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, Request};
use axum::http::header::CONTENT_TYPE;
use axum::Json;
use serde::de::DeserializeOwned;

/// A JSON body of type `T`, refused as axum's `Json<T>` refuses it (module doc).
pub(super) struct UpstreamJson<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for UpstreamJson<T> {
    type Rejection = JsonRejection;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        // Exactly this content type is JSON to axum; every other one is left to axum to judge.
        let plain_json = req
            .headers()
            .get(CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"application/json"));
        if !plain_json {
            return Json::<T>::from_request(req, state).await.map(|Json(v)| Self(v));
        }
        // What axum's `Json` does after the content type: the body (under the route's limit),
        // then the parse; only a failed parse is parsed again, for axum's rejection.
        let bytes = Bytes::from_request(req, state).await?;
        match serde_json::from_slice(&bytes) {
            Ok(v) => Ok(Self(v)),
            Err(_) => Json::<T>::from_bytes(&bytes).map(|Json(v)| Self(v)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::response::IntoResponse;

    #[derive(serde::Deserialize, Debug, PartialEq)]
    struct Q {
        token_ids: Vec<u32>,
        model_name: String,
    }

    fn request(content_type: Option<&str>, body: &'static str) -> Request {
        let mut b = Request::builder().method("POST").uri("/query");
        if let Some(ct) = content_type {
            b = b.header(CONTENT_TYPE, ct);
        }
        b.body(Body::from(body)).unwrap()
    }

    /// (status, body text) of a rejection or "ok".
    async fn answer<E: FromRequest<()>>(req: Request) -> (u16, String)
    where
        E::Rejection: IntoResponse,
    {
        match E::from_request(req, &()).await {
            Ok(_) => (200, "ok".into()),
            Err(e) => {
                let r = e.into_response();
                let status = r.status().as_u16();
                let body = axum::body::to_bytes(r.into_body(), 1 << 20).await.unwrap();
                (status, String::from_utf8_lossy(&body).into_owned())
            }
        }
    }

    /// Every case answers as axum's `Json` does, status and text: accepted bodies, a missing or
    /// other content type (415), a JSON content type with parameters or a `+json` subtype, a
    /// body that is not JSON (400), trailing data, and a body of the wrong shape (422).
    #[tokio::test]
    async fn answers_as_axum_json_does() {
        let good = r#"{"token_ids": [1, 2, 3], "model_name": "m"}"#;
        let cases: [(Option<&str>, &'static str); 9] = [
            (Some("application/json"), good),
            (Some("APPLICATION/JSON"), good),
            (Some("application/json; charset=utf-8"), good),
            (Some("application/vnd.x+json"), good),
            (None, good),
            (Some("text/plain"), good),
            (Some("application/json"), "{not json"),
            (Some("application/json"), r#"{"token_ids": [1, -2], "model_name": "m"}"#),
            (Some("application/json"), r#"{"token_ids": [1], "model_name": "m"} x"#),
        ];
        for (ct, body) in cases {
            let ours = answer::<UpstreamJson<Q>>(request(ct, body)).await;
            let axum = answer::<Json<Q>>(request(ct, body)).await;
            assert_eq!(ours, axum, "content type {ct:?}, body {body}");
        }
        let UpstreamJson(q) = UpstreamJson::<Q>::from_request(request(Some("application/json"), good), &())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(q, Q { token_ids: vec![1, 2, 3], model_name: "m".into() });
    }
}
