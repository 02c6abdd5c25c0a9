//! Test environment for berth's own tests and benchmarks: a real registry (Debian's
//! `docker-registry`) on loopback with images generated here, optionally behind basic auth or a
//! token server of our own, optionally over TLS; plus etcd and containerd. Never used at run time.
//!
//! # Registry
//!
//! ```no_run
//! # async fn demo() {
//! use berth_testenv::{Registry, images::Platform};
//! let reg = Registry::start();                       // plain HTTP on 127.0.0.1:<free port>
//! let set = reg.push_standard_set().await;           // busybox, multi (index), zstd, plain, ...
//! let r = &set.busybox.reference;                    // "127.0.0.1:PORT/busybox:latest"
//! let digest = set.busybox.digest();                 // manifest digest the registry serves
//! let diff_ids = set.busybox.image.diff_ids();       // what an unpacker must compute
//! let arm = set.multi.index.image_for(&Platform::parse("linux/arm64/v8")).unwrap();
//! std::fs::write(reg.blob_path(&set.zstd.image.layers[0].digest), b"corrupt").unwrap();
//! # let _ = (r, digest, diff_ids, arm); }
//! ```
//!
//! - `Registry::start()`, `start_basic_auth(u, p)`, `start_token_auth(u, p)`, `start_tls()`, or
//!   `Registry::builder().token_auth(u, p).public_repo("library/").tls().start()`. Starting is
//!   synchronous (fine inside `#[tokio::test]`; it takes ~50 ms); pushing is async (reqwest);
//!   [`block_on`] runs any of it from sync code (benchmarks, `OnceLock` initialisers).
//!   The registry runs under a watchdog shell that kills it and deletes its temp dir when the
//!   test process dies even without `Drop`, so sharing one through a `static` is fine.
//! - `host()`, `base_url()`, `url(path)`, `reference(name)`, `client()` (trusts `ca_pem()`),
//!   `credentials()`, `token_server()`, `blob_path(digest)`, `root()`, `log()`, `stop()`.
//! - `push_image(repo, tag, &Image)`, `push_index(repo, tag, &Index)` (pushes the index's images
//!   by digest first), `push_blob`, `push_manifest`; they authenticate as the registry requires.
//! - `push_standard_set()` → [`StandardSet`]; `push_big(size_mb)` → `big:1.0` for benchmarks;
//!   `push_pause()` → `pause:3.9` (static pause compiled from `c/pause.c` with `cc`).
//!
//! Token auth: anonymous requests to the registry get `401` with
//! `WWW-Authenticate: Bearer realm="http://127.0.0.1:P/token",service="berth-testenv-registry",scope=…`;
//! `GET realm?service=…&scope=repository:NAME:pull` with the right basic credentials returns
//! `{"token": …}` (ES256 JWT, `kid` = libtrust key ID of the key in `rootcertbundle`); wrong
//! credentials get 401; no credentials get a token without access (pull on `public_repo`s).
//!
//! # Images
//!
//! [`images`] builds layers from [`images::LayerBuilder`] entries (files with mode/uid/gid, dirs,
//! symlinks, hardlinks, whiteouts, opaque dirs), compresses them (gzip, zstd, none), and builds
//! configs, manifests and indexes in OCI or Docker schema 2 media types, all deterministic.
//! [`images::busybox_layer`] is a runnable rootfs from Debian's static busybox (applets hard-linked);
//! [`images::busybox_symlinked_image`] is the same with symlinked applets, which containerd runs too.
//!
//! # Throttling
//!
//! [`ThrottledProxy::start(registry.host(), bytes_per_sec)`](ThrottledProxy) forwards TCP to the
//! registry at a limited rate and counts the bytes, to interrupt pulls mid-download and to see
//! whether a retry resumed.
//!
//! # etcd
//!
//! `Etcd::start()` → `endpoint()` (`http://127.0.0.1:PORT`), killed and deleted on drop.
//! `EtcdCluster::start(3)` → `endpoints()`, `kill(i)`/`restart(i)`, `leader()`, `wait_for_leader(t)`:
//! members to crash and bring back, for tests of leader loss and lost quorum.
//!
//! # containerd
//!
//! ```no_run
//! # async fn demo() {
//! use berth_testenv::{Containerd, Registry};
//! let reg = Registry::start();
//! reg.push_pause().await;                            // the sandbox image, registry.k8s.io/pause:3.9
//! let ctd = Containerd::builder().registry(reg.host()).handler("ctd-runc", "runc").start();
//! let endpoint = ctd.endpoint();                     // "unix:///tmp/berth-testenv-containerd.…/containerd.sock"
//! let subnet = &ctd.network().subnet;                // its pods' addresses, e.g. "10.213.7.0/24"
//! # let _ = (endpoint, subnet); }
//! ```
//!
//! Debian's containerd 1.6 with the CRI plugin, in a temp dir of its own (config, root, state,
//! socket, CNI conf and IPAM state), handlers `runc` (default), `crun`, `gvisor` (runsc behind a
//! wrapper, see `assets/runsc-cri.sh`) plus any added with `handler(name, binary)`, the cgroupfs
//! driver and `restrict_oom_score_adj` (root lacks CAP_SYS_RESOURCE on the project's VMs). Its pods
//! get a bridge of their own ([`cni::BridgeNetwork::unique`]; [`cni`] lists who uses which
//! range). `log()`/`log_tail(n)`, `pid()`, `handlers()`, `stop()`. On drop, or when the test
//! process dies, its watchdog stops containerd, kills the containers and shims it left, unmounts
//! what is mounted under its dir and deletes the bridge. Pods should still be removed through
//! CRI first: that is the runtime's own, complete teardown.
//!
//! Needs the Debian packages `docker-registry`, `apache2-utils` (basic auth), `busybox-static`,
//! `etcd-server`, `containerd`, `runc` and `containernetworking-plugins` (all in
//! `scripts/install-deps.sh`); a missing one fails the test loudly.

pub mod bundle;
pub mod cni;
pub mod containerd;
pub mod daemon;
pub mod etcd;
pub mod images;
pub mod monitor;
pub mod proxy;
pub mod registry;
pub mod standard;
pub mod tls;
pub mod token;

pub use containerd::{Containerd, ContainerdBuilder};
pub use etcd::{Etcd, EtcdCluster};
pub use proxy::ThrottledProxy;
pub use registry::{PushedImage, PushedIndex, Registry, RegistryAuth, RegistryBuilder};
pub use standard::StandardSet;
pub use token::TokenServer;

/// Runs a future to completion on a fresh current-thread runtime in a scoped thread, so sync
/// code (and code already inside a runtime) can call the async pushes:
/// `let set = berth_testenv::block_on(reg.push_standard_set());`.
pub fn block_on<F>(fut: F) -> F::Output
where
    F: std::future::Future + Send,
    F::Output: Send,
{
    std::thread::scope(|s| {
        s.spawn(|| {
            tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime").block_on(fut)
        })
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

#[cfg(test)]
mod tests {
    fn shareable<T: Send + Sync>() {}

    #[test]
    fn handles_are_send_and_sync() {
        shareable::<crate::Registry>();
        shareable::<crate::Etcd>();
        shareable::<crate::EtcdCluster>();
        shareable::<crate::Containerd>();
        shareable::<crate::StandardSet>();
    }
}
