//! Single-use, short-lived tokens that stand for a validated CRI stream request (kubelet's request cache).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::Engine;

/// How long a URL handed out by `get_exec`/`get_attach`/`get_port_forward` stays usable.
pub const TOKEN_TTL: Duration = Duration::from_secs(60);

/// At most this many requests wait for their client at once, like kubelet's `MaxInFlight`.
pub const MAX_IN_FLIGHT: usize = 1000;

/// A request that has been validated and waits for the client to connect.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    Exec(k8s_cri::v1::ExecRequest),
    Attach(k8s_cri::v1::AttachRequest),
    PortForward(k8s_cri::v1::PortForwardRequest),
}

#[derive(Debug, thiserror::Error)]
#[error("maximum number of in-flight stream requests ({MAX_IN_FLIGHT}) exceeded")]
pub struct CacheFull;

/// Tokens map to requests; each is consumed by its first use and expires after [`TOKEN_TTL`].
#[derive(Debug, Default)]
pub struct RequestCache {
    entries: Mutex<HashMap<String, (Request, Instant)>>,
}

impl RequestCache {
    /// Stores `req` under a fresh random token and returns the token.
    pub fn insert(&self, req: Request) -> Result<String, CacheFull> {
        self.insert_at(req, Instant::now())
    }

    fn insert_at(&self, req: Request, now: Instant) -> Result<String, CacheFull> {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.retain(|_, (_, expires)| *expires > now);
        if entries.len() >= MAX_IN_FLIGHT {
            return Err(CacheFull);
        }
        // 122 random bits from a v4 UUID, URL-safe so the token can sit in a path segment.
        let token = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(uuid::Uuid::new_v4().as_bytes());
        entries.insert(token.clone(), (req, now + TOKEN_TTL));
        Ok(token)
    }

    /// The request for `token` if it exists and has not expired, leaving it in place.
    pub fn get(&self, token: &str) -> Option<Request> {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.get(token).filter(|(_, expires)| *expires > Instant::now()).map(|(req, _)| req.clone())
    }

    /// Removes and returns the request for `token` if it exists and has not expired.
    pub fn consume(&self, token: &str) -> Option<Request> {
        self.consume_at(token, Instant::now())
    }

    fn consume_at(&self, token: &str, now: Instant) -> Option<Request> {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let (req, expires) = entries.remove(token)?;
        (expires > now).then_some(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req() -> Request {
        Request::PortForward(k8s_cri::v1::PortForwardRequest { pod_sandbox_id: "p".into(), port: vec![80] })
    }

    #[test]
    fn a_token_can_be_used_only_once() {
        let cache = RequestCache::default();
        let token = cache.insert(req()).unwrap();
        assert_eq!(cache.consume(&token), Some(req()));
        assert_eq!(cache.consume(&token), None);
    }

    #[test]
    fn a_token_expires_after_one_minute() {
        let cache = RequestCache::default();
        let now = Instant::now();
        let token = cache.insert_at(req(), now).unwrap();
        assert_eq!(cache.consume_at(&token, now + TOKEN_TTL + Duration::from_millis(1)), None);
        let token = cache.insert_at(req(), now).unwrap();
        assert!(cache.consume_at(&token, now + Duration::from_secs(59)).is_some());
    }

    #[test]
    fn the_cache_refuses_requests_beyond_the_in_flight_limit_until_some_expire() {
        let cache = RequestCache::default();
        let now = Instant::now();
        for _ in 0..MAX_IN_FLIGHT {
            cache.insert_at(req(), now).unwrap();
        }
        assert!(cache.insert_at(req(), now).is_err());
        assert!(cache.insert_at(req(), now + TOKEN_TTL + Duration::from_secs(1)).is_ok());
    }

    #[test]
    fn tokens_are_distinct_and_url_safe() {
        let cache = RequestCache::default();
        let a = cache.insert(req()).unwrap();
        let b = cache.insert(req()).unwrap();
        assert_ne!(a, b);
        assert!(a.len() >= 16 && a.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'));
    }
}
