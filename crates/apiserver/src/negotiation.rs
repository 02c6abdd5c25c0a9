//! Response content negotiation: every `/api` and `/apis` response is produced as JSON by the
//! handlers, and turned into Kubernetes protobuf here, in one place, when the `Accept` header
//! prefers it.
//!
//! `Accept` ranges are ranked by `q` (ties keep their order); JSON (`application/json`,
//! `application/*`, `*/*`, or no header) stays the default. When protobuf wins, a single object,
//! a list or a `Status` is re-encoded with [`protobuf::encode`]; a watch stream becomes
//! `application/vnd.kubernetes.protobuf;stream=watch` frames ([`protobuf::watch_frame`]). What has no
//! protobuf message (a `Table`, a custom resource) stays JSON when the client also accepts JSON, and is
//! `406 NotAcceptable` otherwise, as kube-apiserver answers.

use axum::body::Body;
use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::StreamExt;
use http::{HeaderMap, HeaderValue, StatusCode};
use serde_json::Value;

use crate::ApiError;
use crate::protobuf::{self, EncodeError};
use crate::request::{self, Output};

/// Marks a response whose body is a JSON watch stream (one event per line).
#[derive(Debug, Clone, Copy)]
pub struct WatchStream;

/// What the client's `Accept` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Accept {
    /// Protobuf ranks above every JSON range.
    pub protobuf: bool,
    /// Some JSON range is acceptable (the fallback for what protobuf cannot carry).
    pub json: bool,
}

impl Accept {
    pub fn from_headers(headers: &HeaderMap) -> Self {
        let accept = headers.get(http::header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or("");
        Self::parse(accept)
    }

    pub fn parse(accept: &str) -> Self {
        let mut ranges: Vec<(&str, f32)> = accept
            .split(',')
            .filter_map(|range| {
                let mut params = range.split(';').map(str::trim);
                let media = params.next().filter(|m| !m.is_empty())?;
                let q = params
                    .find_map(|p| p.strip_prefix("q="))
                    .map_or(Some(1.0), |q| q.parse::<f32>().ok())
                    .unwrap_or(0.0);
                (q > 0.0).then_some((media, q))
            })
            .collect();
        if ranges.is_empty() {
            return Accept { protobuf: false, json: true };
        }
        // A stable sort: equal weights keep the client's order.
        ranges.sort_by(|a, b| b.1.total_cmp(&a.1));
        let is_json = |m: &str| {
            let m = m.to_ascii_lowercase();
            m == "application/json" || m == "application/*" || m == "*/*"
        };
        let is_protobuf = |m: &str| m.eq_ignore_ascii_case(protobuf::MEDIA_TYPE);
        let first = ranges.iter().find(|(m, _)| is_json(m) || is_protobuf(m));
        Accept {
            protobuf: first.is_some_and(|(m, _)| is_protobuf(m)),
            json: ranges.iter().any(|(m, _)| is_json(m)) || first.is_none(),
        }
    }
}

/// The middleware: re-encodes the JSON responses of `/api` and `/apis` as the client asked.
pub async fn encode(req: Request, next: Next) -> Response {
    let path = req.uri().path();
    let api = path == "/api" || path.starts_with("/api/") || path == "/apis" || path.starts_with("/apis/");
    let accept = Accept::from_headers(req.headers());
    let table = request::output(req.headers()) == Output::Table;
    let resp = next.run(req).await;
    if !api || !accept.protobuf || !is_json(resp.headers()) {
        return resp;
    }
    if resp.extensions().get::<WatchStream>().is_some() {
        return match (table, accept.json) {
            (true, true) => resp,
            (true, false) => not_acceptable(),
            (false, _) => watch_response(resp),
        };
    }
    // Tables have no protobuf encoding: no need to read (and parse) one.
    if table {
        return if accept.json { resp } else { not_acceptable() };
    }
    let (mut parts, body) = resp.into_parts();
    let bytes = match axum::body::to_bytes(body, usize::MAX).await {
        Ok(b) => b,
        Err(e) => return ApiError::internal(format!("reading the response: {e}")).into_response(),
    };
    let encoded = serde_json::from_slice::<Value>(&bytes)
        .map_err(|e| EncodeError::Invalid { kind: "response".into(), reason: e.to_string() })
        .and_then(|v| protobuf::encode(&v));
    match encoded {
        Ok(pb) => {
            parts.headers.insert(http::header::CONTENT_TYPE, HeaderValue::from_static(protobuf::MEDIA_TYPE));
            parts.headers.remove(http::header::CONTENT_LENGTH);
            Response::from_parts(parts, Body::from(pb))
        }
        Err(e) if accept.json => {
            tracing::debug!(error = %e, "answering JSON: no protobuf encoding");
            Response::from_parts(parts, Body::from(bytes))
        }
        Err(e) => {
            tracing::debug!(error = %e, "no protobuf encoding and JSON not accepted");
            not_acceptable()
        }
    }
}

fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.split(';').next().is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json")))
}

/// 406 as a protobuf `Status` (the client accepts nothing else).
fn not_acceptable() -> Response {
    let status = ApiError::new(
        406,
        "NotAcceptable",
        "only the following media types are accepted: application/json, application/yaml, application/vnd.kubernetes.protobuf",
    )
    .to_status();
    match protobuf::encode(&status) {
        Ok(pb) => {
            (StatusCode::NOT_ACCEPTABLE, [(http::header::CONTENT_TYPE, protobuf::MEDIA_TYPE)], pb).into_response()
        }
        Err(_) => ApiError::new(406, "NotAcceptable", "not acceptable").into_response(),
    }
}

/// Turns a JSON watch body (one `{"type","object"}` per line) into protobuf watch frames.
fn watch_response(resp: Response) -> Response {
    let (mut parts, body) = resp.into_parts();
    parts.headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/vnd.kubernetes.protobuf;stream=watch"),
    );
    parts.headers.remove(http::header::CONTENT_LENGTH);
    let mut pending = Vec::new();
    let frames = body.into_data_stream().filter_map(move |chunk| {
        let out = chunk.map(|chunk| {
            pending.extend_from_slice(&chunk);
            let mut frames = Vec::new();
            while let Some(end) = pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = pending.drain(..=end).collect();
                match watch_line(&line) {
                    Ok(frame) => frames.extend_from_slice(&frame),
                    Err(e) => tracing::warn!(error = %e, "dropping a watch event without protobuf encoding"),
                }
            }
            Bytes::from(frames)
        });
        std::future::ready(match out {
            Ok(b) if b.is_empty() => None,
            other => Some(other),
        })
    });
    Response::from_parts(parts, Body::from_stream(frames))
}

fn watch_line(line: &[u8]) -> Result<Vec<u8>, EncodeError> {
    let invalid = |reason: String| EncodeError::Invalid { kind: "WatchEvent".into(), reason };
    let event: Value = serde_json::from_slice(line).map_err(|e| invalid(e.to_string()))?;
    let kind = event.get("type").and_then(Value::as_str).ok_or_else(|| invalid("no type".into()))?;
    let object = event.get("object").ok_or_else(|| invalid("no object".into()))?;
    protobuf::watch_frame(kind, object)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_is_the_default_without_an_accept_header() {
        assert_eq!(Accept::parse(""), Accept { protobuf: false, json: true });
        assert_eq!(Accept::parse("application/json"), Accept { protobuf: false, json: true });
    }

    #[test]
    fn client_gos_protobuf_accept_prefers_protobuf_with_a_json_fallback() {
        let a = Accept::parse("application/vnd.kubernetes.protobuf, */*");
        assert_eq!(a, Accept { protobuf: true, json: true });
        let a = Accept::parse("application/vnd.kubernetes.protobuf;stream=watch");
        assert_eq!(a, Accept { protobuf: true, json: false });
    }

    #[test]
    fn q_values_rank_the_ranges_and_q_zero_refuses_one() {
        let a = Accept::parse("application/json;q=0.5, application/vnd.kubernetes.protobuf");
        assert_eq!(a, Accept { protobuf: true, json: true });
        let a = Accept::parse("application/vnd.kubernetes.protobuf;q=0.2, application/json;q=0.9");
        assert_eq!(a, Accept { protobuf: false, json: true });
        let a = Accept::parse("application/vnd.kubernetes.protobuf, application/json;q=0");
        assert_eq!(a, Accept { protobuf: true, json: false });
    }

    #[test]
    fn equal_weights_keep_the_clients_order() {
        let a = Accept::parse("application/json, application/vnd.kubernetes.protobuf");
        assert_eq!(a, Accept { protobuf: false, json: true });
    }
}
