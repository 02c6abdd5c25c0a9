//! What the pod's volumes and environment are made from: ConfigMaps, Secrets, Services and
//! service account tokens read through the API, and the volumes set up (and refreshed) from them.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1 as core;
use kube::api::Api;

use super::{Next, Running, Shell, WorkerError};
use crate::pods::env::{self, Sources};
use crate::pods::tokens::{self, Token, TokenKey};
use crate::pods::volumes;
use berth_events as events;

/// How often configMap, secret and downwardAPI volumes are rewritten from the API.
const VOLUME_REFRESH: Duration = Duration::from_secs(60);

impl Shell {
    pub(super) async fn fetch_sources(&self) -> Result<Sources, WorkerError> {
        let (mut cms, mut secrets) = env::referenced(self.spec());
        let (vcms, vsecrets) = volumes::referenced(self.spec());
        cms.extend(vcms);
        secrets.extend(vsecrets);
        cms.sort();
        cms.dedup();
        secrets.sort();
        secrets.dedup();
        let (_, ns) = self.names();
        let mut sources = Sources::default();
        let cm_api: Api<core::ConfigMap> = Api::namespaced(self.ctx.client.clone(), &ns);
        for name in cms {
            let cm = cm_api.get_opt(&name).await.map_err(|source| WorkerError::Api {
                action: "reading a ConfigMap",
                pod: self.pod_ref(),
                source,
            })?;
            sources.config_maps.insert(name, cm.as_ref().map(env::config_map_data));
        }
        let secret_api: Api<core::Secret> = Api::namespaced(self.ctx.client.clone(), &ns);
        for name in secrets {
            let s = secret_api.get_opt(&name).await.map_err(|source| WorkerError::Api {
                action: "reading a Secret",
                pod: self.pod_ref(),
                source,
            })?;
            sources.secrets.insert(name, s.as_ref().map(env::secret_data));
        }
        sources.services = self.linked_services(&ns);
        Ok(sources)
    }

    /// The Services whose variables the containers get (kubelet's service links).
    fn linked_services(&self, ns: &str) -> Vec<core::Service> {
        let candidates = self.ctx.services.state().into_iter().filter(|s| {
            let svc_ns = s.metadata.namespace.as_deref();
            svc_ns == Some(ns) || (svc_ns == Some("default") && s.metadata.name.as_deref() == Some("kubernetes"))
        });
        env::service_links(self.spec(), ns, candidates.map(|s| s.as_ref().clone()).collect())
    }

    /// Whether a token held is due for refresh.
    fn token_due(&self) -> bool {
        let (now, jitter) = (self.now(), tokens::jitter(&self.uid));
        self.tokens.values().any(|t| t.needs_refresh(now, jitter))
    }

    /// The tokens of the pod's projected volumes: those held while not due, else new ones from
    /// TokenRequest (as the node; bound to the pod). A token that cannot be renewed is used until
    /// it expires, as kubelet's token manager does.
    async fn fetch_tokens(&mut self) -> HashMap<TokenKey, Result<String, String>> {
        let keys = tokens::referenced(self.spec());
        self.tokens.retain(|k, _| keys.contains(k));
        let (_, ns) = self.names();
        let sa = tokens::service_account(&self.pod);
        let api: Api<core::ServiceAccount> = Api::namespaced(self.ctx.client.clone(), &ns);
        let (now, jitter) = (self.now(), tokens::jitter(&self.uid));
        let mut out = HashMap::new();
        for key in keys {
            if let Some(held) = self.tokens.get(&key).filter(|t| !t.needs_refresh(now, jitter)) {
                out.insert(key, Ok(held.token.clone()));
                continue;
            }
            let asked = api.create_token_request(&sa, &Default::default(), &tokens::request(&self.pod, &key)).await;
            let fetched = match asked {
                Ok(tr) => {
                    Token::from_response(&tr, &key).ok_or_else(|| "the TokenRequest returned no token".to_string())
                }
                Err(kube::Error::Api(status)) => Err(status.message.clone()),
                Err(e) => Err(berth_common::error::error_chain(&e)),
            };
            let result = match fetched {
                Ok(token) => {
                    tracing::debug!(pod = %self.pod_ref(), service_account = %sa, audience = %key.audience, expires = %token.expires_at, "service account token issued");
                    let value = token.token.clone();
                    self.tokens.insert(key.clone(), token);
                    Ok(value)
                }
                Err(why) => match self.tokens.get(&key).filter(|t| !t.is_expired(now)) {
                    Some(held) => {
                        tracing::warn!(pod = %self.pod_ref(), service_account = %sa, error = %why, "service account token refresh failed; the current one is kept until it expires");
                        Ok(held.token.clone())
                    }
                    None => Err(why),
                },
            };
            out.insert(key, result);
        }
        out
    }

    /// Sets up (or refreshes) the volumes; `Some(next)` when they are not ready.
    pub(super) async fn ensure_volumes(&mut self, r: &mut Running) -> Result<Option<Next>, WorkerError> {
        if self.spec().volumes.as_ref().is_none_or(|v| v.is_empty()) {
            return Ok(None);
        }
        if r.volumes.as_ref().is_some_and(|(_, at)| at.elapsed() < VOLUME_REFRESH) && !self.token_due() {
            return Ok(None);
        }
        let mut sources = self.fetch_sources().await?;
        sources.tokens = self.fetch_tokens().await;
        let ctx = self.pod_context(r.sandbox.held());
        let (root, pod, mounter) = (self.ctx.root_dir.clone(), self.pod.clone(), self.ctx.mounter.clone());
        let result =
            tokio::task::spawn_blocking(move || volumes::prepare(&root, &pod, &sources, &ctx, mounter.as_ref()))
                .await
                .unwrap_or_else(|e| {
                    Err((
                        "(all)".into(),
                        volumes::VolumeError::Io {
                            action: "preparing",
                            path: PathBuf::new(),
                            source: std::io::Error::other(e),
                        },
                    ))
                });
        match result {
            Ok(prepared) => {
                r.volumes = Some((prepared, tokio::time::Instant::now()));
                Ok(None)
            }
            Err((name, e)) if r.volumes.is_some() => {
                // A refresh that fails keeps the volumes as they are.
                tracing::warn!(pod = %self.pod_ref(), volume = %name, error = %berth_common::error::error_chain(&e), "volume refresh failed");
                if let Some((_, at)) = r.volumes.as_mut() {
                    *at = tokio::time::Instant::now();
                }
                Ok(None)
            }
            Err((name, e)) => {
                self.event(
                    events::Type::Warning,
                    "",
                    "FailedMount",
                    format!("MountVolume.SetUp failed for volume {name:?} : {}", berth_common::error::error_chain(&e)),
                );
                Ok(Some(Next::After(Duration::from_secs(2))))
            }
        }
    }
}
