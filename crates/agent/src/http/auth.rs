//! Who may use the agent's API: bearer tokens checked with a `TokenReview` against the control
//! plane (results cached for a minute), then allowed for `system:masters` and the node itself.
//!
//! kubelet asks the API server twice (TokenReview, then SubjectAccessReview); berth's agent
//! serves only the control plane's proxy (which calls with the admin identity) and its own node,
//! so the second question is answered here.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::{Api, PostParams};

/// How long a successful review is trusted.
const AUTHENTICATED_TTL: Duration = Duration::from_secs(60);
/// How long a rejected token stays rejected without asking again.
const REJECTED_TTL: Duration = Duration::from_secs(10);
/// Past this many cached tokens, expired entries are dropped (and all of them if none expired).
const MAX_CACHED: usize = 4096;

/// The identity a token stands for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub groups: Vec<String>,
}

/// Why a request is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// 401: no token, or the control plane does not know it.
    #[error("Unauthorized")]
    Unauthorized,
    /// 401: the token could not be reviewed (the control plane is unreachable).
    #[error("Unauthorized: the token could not be reviewed: {0}")]
    ReviewFailed(String),
    /// 403: a known user that is neither an admin nor this node.
    #[error("Forbidden (user={user}, verb={verb}, resource=nodes, subresource={subresource})")]
    Forbidden { user: String, verb: String, subresource: String },
}

impl AuthError {
    pub fn status_code(&self) -> u16 {
        match self {
            AuthError::Forbidden { .. } => 403,
            _ => 401,
        }
    }
}

/// Reviews tokens with the control plane and remembers the answers.
pub struct Authenticator {
    client: kube::Client,
    node_user: String,
    cache: Mutex<HashMap<String, (Instant, Option<User>)>>,
}

impl Authenticator {
    pub fn new(client: kube::Client, node_name: &str) -> Self {
        Authenticator { client, node_user: format!("system:node:{node_name}"), cache: Mutex::new(HashMap::new()) }
    }

    /// The user behind an `Authorization` header.
    pub async fn authenticate(&self, authorization: Option<&str>) -> Result<User, AuthError> {
        let token = authorization.and_then(bearer_token).ok_or(AuthError::Unauthorized)?;
        if let Some(known) = self.cached(token) {
            return known.ok_or(AuthError::Unauthorized);
        }
        let review = TokenReview {
            spec: TokenReviewSpec { token: Some(token.to_string()), ..Default::default() },
            ..Default::default()
        };
        let reviewed = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| AuthError::ReviewFailed(e.to_string()))?;
        let status = reviewed.status.unwrap_or_default();
        let user = match (status.authenticated, status.user) {
            (Some(true), Some(info)) => {
                Some(User { name: info.username.unwrap_or_default(), groups: info.groups.unwrap_or_default() })
            }
            _ => None,
        };
        self.remember(token, user.clone());
        user.ok_or(AuthError::Unauthorized)
    }

    /// Admins (`system:masters`) and this node may do anything here; others are refused.
    pub fn authorize(&self, user: &User, verb: &str, subresource: &str) -> Result<(), AuthError> {
        if allowed(&self.node_user, user) {
            return Ok(());
        }
        Err(AuthError::Forbidden { user: user.name.clone(), verb: verb.into(), subresource: subresource.into() })
    }

    fn cached(&self, token: &str) -> Option<Option<User>> {
        let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let (expires, user) = cache.get(token)?;
        (Instant::now() < *expires).then(|| user.clone())
    }

    fn remember(&self, token: &str, user: Option<User>) {
        let ttl = if user.is_some() { AUTHENTICATED_TTL } else { REJECTED_TTL };
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= MAX_CACHED {
            let now = Instant::now();
            cache.retain(|_, (expires, _)| *expires > now);
            if cache.len() >= MAX_CACHED {
                cache.clear();
            }
        }
        cache.insert(token.to_string(), (Instant::now() + ttl, user));
    }
}

fn allowed(node_user: &str, user: &User) -> bool {
    user.groups.iter().any(|g| g == "system:masters") || user.name == node_user
}

/// The token of `Bearer <token>` (scheme case-insensitive), as kube-apiserver splits it.
fn bearer_token(header: &str) -> Option<&str> {
    let (scheme, rest) = header.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    rest.split(' ').next().filter(|t| !t.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens_are_taken_from_the_header() {
        assert_eq!(bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(bearer_token("bearer abc extra"), Some("abc"));
        assert_eq!(bearer_token("Basic abc"), None);
        assert_eq!(bearer_token("Bearer "), None);
        assert_eq!(bearer_token("abc"), None);
    }

    #[test]
    fn admins_and_the_node_itself_are_allowed_but_other_nodes_and_users_are_not() {
        let user = |name: &str, groups: &[&str]| User {
            name: name.into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
        };
        let node = "system:node:node-a";
        assert!(allowed(node, &user("admin", &["system:masters", "system:authenticated"])));
        assert!(allowed(node, &user("system:node:node-a", &["system:nodes"])));
        assert!(!allowed(node, &user("system:node:node-b", &["system:nodes"])));
        assert!(!allowed(node, &user("alice", &["system:authenticated"])));
    }

    #[test]
    fn forbidden_names_the_user_verb_and_subresource_as_kubelet_does() {
        let err = AuthError::Forbidden { user: "alice".into(), verb: "create".into(), subresource: "proxy".into() };
        assert_eq!(err.to_string(), "Forbidden (user=alice, verb=create, resource=nodes, subresource=proxy)");
        assert_eq!(err.status_code(), 403);
        assert_eq!(AuthError::Unauthorized.status_code(), 401);
    }
}
