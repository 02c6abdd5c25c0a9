//! The CRI unix socket: its directory, owner-only permissions, stale sockets from a previous run,
//! and serving gRPC routes on it until shutdown.

mod authority;

use std::future::Future;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::net::UnixListener;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnixListenerStream;

/// RPCs started so far, in this process.
static RPCS: AtomicU64 = AtomicU64::new(0);

/// How many RPCs the CRI servers of this process have started: the binary trims memory once it
/// stops moving.
pub fn rpcs_started() -> u64 {
    RPCS.load(Ordering::Relaxed)
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot create socket directory {path}")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is in use by a running server")]
    InUse { path: PathBuf },
    #[error("{path} exists and is not a socket")]
    NotASocket { path: PathBuf },
    #[error("cannot listen on {path}")]
    Bind {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("serving grpc on {path}")]
    Serve {
        path: PathBuf,
        #[source]
        source: tonic::transport::Error,
    },
}

/// A listening socket at its final path; removed again when serving ends.
pub struct SocketListener {
    listener: UnixListener,
    path: PathBuf,
}

/// Listens on `path` with mode 0600, creating its directory. A socket left by a dead server is
/// replaced; one a live server answers on is not. The socket appears at `path` only once it is
/// listening with its final mode (bound under a temporary name, then renamed).
pub async fn bind(path: &Path) -> Result<SocketListener, ServeError> {
    let bind_err = |source| ServeError::Bind { path: path.to_owned(), source };
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|source| ServeError::CreateDir { path: dir.to_owned(), source })?;

    match std::fs::symlink_metadata(path) {
        Ok(m) if !m.file_type().is_socket() => return Err(ServeError::NotASocket { path: path.to_owned() }),
        Ok(_) => {
            if tokio::net::UnixStream::connect(path).await.is_ok() {
                return Err(ServeError::InUse { path: path.to_owned() });
            }
            tracing::info!(socket = %path.display(), "removing stale socket");
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(bind_err(e)),
    }

    let name = path.file_name().ok_or_else(|| bind_err(std::io::Error::other("socket path has no file name")))?;
    let tmp = dir.join(format!(".{}.{}.tmp", name.to_string_lossy(), std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let listener = UnixListener::bind(&tmp).map_err(bind_err)?;
    let placed = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&tmp);
        return Err(bind_err(e));
    }
    Ok(SocketListener { listener, path: path.to_owned() })
}

impl SocketListener {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Serves `routes` until `shutdown` completes, then removes the socket.
    pub async fn serve(
        self,
        routes: tonic::service::Routes,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), ServeError> {
        let SocketListener { listener, path } = self;
        tracing::info!(socket = %path.display(), "serving CRI");
        // Older grpc-go clients send the socket path as :authority, which h2 alone would refuse.
        let incoming = UnixListenerStream::new(listener).map(|conn| conn.map(authority::AuthorityRewrite::new));
        let result = tonic::transport::Server::builder()
            .layer(tower::util::MapRequestLayer::new(|request| {
                RPCS.fetch_add(1, Ordering::Relaxed);
                request
            }))
            .add_routes(routes)
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await;
        let _ = std::fs::remove_file(&path);
        result.map_err(|source| ServeError::Serve { path, source })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn socket_is_owner_only_and_its_directory_is_created() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run/berth/runtime.sock");
        let l = bind(&path).await.unwrap();
        let meta = std::fs::metadata(l.path()).unwrap();
        assert!(meta.file_type().is_socket());
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::read_dir(path.parent().unwrap()).unwrap().count(), 1, "no temporary socket left");
    }

    #[tokio::test]
    async fn a_stale_socket_is_replaced_and_a_live_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runtime.sock");
        let live = bind(&path).await.unwrap();
        assert!(matches!(bind(&path).await, Err(ServeError::InUse { .. })));
        drop(live); // the file stays, nobody listens: stale
        assert!(path.exists());
        bind(&path).await.unwrap();
    }

    #[tokio::test]
    async fn a_regular_file_at_the_socket_path_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runtime.sock");
        std::fs::write(&path, "data").unwrap();
        assert!(matches!(bind(&path).await, Err(ServeError::NotASocket { .. })));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "data");
    }
}
