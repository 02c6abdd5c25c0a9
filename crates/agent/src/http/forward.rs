//! Hands a client's exec, attach or port-forward request to the runtime's streaming server: the
//! request goes on with its upgrade headers, a `101 Switching Protocols` answer is relayed and the
//! two upgraded connections are spliced into one byte pipe; any other answer (the runtime refusing
//! a protocol it does not speak) reaches the client as it is, so the client can fall back.

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{StatusCode, Uri};
use http_body_util::Empty;
use hyper_util::rt::TokioIo;

/// Why the runtime's streaming server could not be reached.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    #[error("the runtime returned an unusable streaming URL {url:?}")]
    BadUrl { url: String },
    #[error("cannot connect to the runtime's streaming server at {addr}")]
    Connect {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the runtime's streaming server at {addr} failed")]
    Http {
        addr: String,
        #[source]
        source: hyper::Error,
    },
}

/// Headers that describe one hop and are not passed on (the upgrade headers are, for upgrades).
const HOP_BY_HOP: &[&str] =
    &["keep-alive", "proxy-connection", "proxy-authorization", "te", "trailer", "transfer-encoding"];

/// Forwards `req` to the streaming `url` (plain `http://host:port/path`, as runtimes return for
/// loopback streaming servers), keeping the client's query when the URL has none.
pub async fn forward(mut req: Request, url: &str) -> Result<Response, ForwardError> {
    let bad = || ForwardError::BadUrl { url: url.to_string() };
    let target: Uri = url.parse().map_err(|_| bad())?;
    if target.scheme_str() != Some("http") {
        return Err(bad());
    }
    let authority = target.authority().ok_or_else(bad)?.clone();
    let addr = format!(
        "{}:{}",
        authority.host().trim_start_matches('[').trim_end_matches(']'),
        authority.port_u16().unwrap_or(80)
    );
    let mut path = target.path().to_string();
    match (target.query(), req.uri().query()) {
        (Some(q), _) | (None, Some(q)) => {
            path.push('?');
            path.push_str(q);
        }
        (None, None) => {}
    }
    let tcp = tokio::net::TcpStream::connect(&addr)
        .await
        .map_err(|source| ForwardError::Connect { addr: addr.clone(), source })?;
    let _ = tcp.set_nodelay(true);
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .map_err(|source| ForwardError::Http { addr: addr.clone(), source })?;
    tokio::spawn(async move {
        if let Err(error) = connection.with_upgrades().await {
            tracing::debug!(%error, "streaming connection to the runtime ended with an error");
        }
    });

    // Taken now, awaited only if the runtime switches protocols.
    let client_side = hyper::upgrade::on(&mut req);
    let (parts, _body) = req.into_parts();
    let upgrading = is_upgrade(&parts.headers);
    let mut outgoing = http::Request::builder().method(parts.method.clone()).uri(path);
    for (name, value) in &parts.headers {
        if passes(name, upgrading) && name != header::AUTHORIZATION && name != header::HOST {
            outgoing = outgoing.header(name, value);
        }
    }
    let outgoing = outgoing.header(header::HOST, authority.as_str()).body(Empty::<Bytes>::new()).map_err(|_| bad())?;
    let mut answer =
        sender.send_request(outgoing).await.map_err(|source| ForwardError::Http { addr: addr.clone(), source })?;

    let mut response = Response::builder().status(answer.status());
    let switching = answer.status() == StatusCode::SWITCHING_PROTOCOLS;
    for (name, value) in answer.headers() {
        if passes(name, switching) {
            response = response.header(name, value);
        }
    }
    if !switching {
        return Ok(response.body(Body::new(answer.into_body())).unwrap_or_else(|_| internal()));
    }
    let runtime_side = hyper::upgrade::on(&mut answer);
    tokio::spawn(async move {
        let (client, runtime) = match tokio::try_join!(client_side, runtime_side) {
            Ok(both) => both,
            Err(error) => {
                tracing::debug!(%error, "a streaming upgrade did not complete");
                return;
            }
        };
        let (mut client, mut runtime) = (TokioIo::new(client), TokioIo::new(runtime));
        if let Err(error) = tokio::io::copy_bidirectional(&mut client, &mut runtime).await {
            tracing::debug!(%error, "a streaming session ended with an error");
        }
    });
    Ok(response.body(Body::empty()).unwrap_or_else(|_| internal()))
}

fn internal() -> Response {
    let mut r = Response::new(Body::empty());
    *r.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
    r
}

/// `Connection: upgrade` with an `Upgrade` protocol.
pub fn is_upgrade(headers: &HeaderMap) -> bool {
    let connection_upgrade = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    connection_upgrade && headers.contains_key(header::UPGRADE)
}

fn passes(name: &HeaderName, upgrading: bool) -> bool {
    if HOP_BY_HOP.contains(&name.as_str()) {
        return false;
    }
    upgrading || (name != header::CONNECTION && name != header::UPGRADE)
}

/// A plain-text error answer, as kubelet writes streaming errors.
pub fn text_error(code: StatusCode, message: &str) -> Response {
    let mut r = Response::new(Body::from(format!("{message}\n")));
    *r.status_mut() = code;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upgrades_need_both_connection_and_upgrade_headers() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, HeaderValue::from_static("keep-alive, Upgrade"));
        assert!(!is_upgrade(&h));
        h.insert(header::UPGRADE, HeaderValue::from_static("SPDY/3.1"));
        assert!(is_upgrade(&h));
        h.insert(header::CONNECTION, HeaderValue::from_static("close"));
        assert!(!is_upgrade(&h));
    }

    #[test]
    fn hop_by_hop_headers_stay_behind_and_upgrade_headers_go_only_with_upgrades() {
        assert!(!passes(&header::TRANSFER_ENCODING, true));
        assert!(passes(&header::UPGRADE, true));
        assert!(!passes(&header::UPGRADE, false));
        assert!(passes(&HeaderName::from_static("x-stream-protocol-version"), true));
    }
}
