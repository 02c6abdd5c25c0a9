//! The CRI v1 runtime: serves ImageService and RuntimeService on a unix socket.
//!
//! [`config`] reads the handlers and their guest platforms, [`cri`] implements the services on
//! top of `berth_image::Images`, the OCI runtimes, the monitors and the CNI plugins, [`host`] is
//! the one module touching the kernel (mounts, infra process, pidfds), [`server`] listens on the
//! socket (and counts the RPCs it serves, for the binary's memory policy), [`state`] keeps the
//! records of sandboxes and containers and [`reality`] reads what is really running after a
//! restart.

pub mod config;
pub mod cri;
pub mod host;
pub mod reality;
pub mod server;
pub mod state;

/// berth's own gRPC services served next to CRI (`berth.runtime.v1`): the streaming pull.
pub mod proto {
    #![allow(clippy::all)]
    tonic::include_proto!("berth.runtime.v1");

    use k8s_cri::v1::AuthConfig;

    // The streaming pull carries CRI's AuthConfig field for field.
    impl From<AuthConfig> for Auth {
        fn from(a: AuthConfig) -> Self {
            Auth {
                username: a.username,
                password: a.password,
                auth: a.auth,
                server_address: a.server_address,
                identity_token: a.identity_token,
                registry_token: a.registry_token,
            }
        }
    }

    impl From<Auth> for AuthConfig {
        fn from(a: Auth) -> Self {
            AuthConfig {
                username: a.username,
                password: a.password,
                auth: a.auth,
                server_address: a.server_address,
                identity_token: a.identity_token,
                registry_token: a.registry_token,
            }
        }
    }
}
