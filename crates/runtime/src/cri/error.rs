//! The CRI service's errors, and their one conversion to gRPC statuses.

use berth_image::ImageError;

use crate::state::StateError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request names a handler the config does not have.
    #[error("unknown runtime handler {handler:?} (configured handlers: {})", known.join(", "))]
    UnknownHandler { handler: String, known: Vec<String> },
    /// A malformed request (missing image spec, empty reference).
    #[error("{0}")]
    InvalidArgument(String),
    /// An image operation failed; `op` is the verb (`pull`, `remove`, ...).
    #[error("{op} image {image:?} for runtime handler {handler:?}")]
    Image {
        op: &'static str,
        image: String,
        handler: String,
        #[source]
        source: Box<ImageError>,
    },
    /// Reading the image filesystem's usage failed.
    #[error("image filesystem usage")]
    FsUsage(#[source] Box<ImageError>),
    /// A blocking image-store task panicked or was cancelled.
    #[error("image store task did not finish")]
    Task(#[source] tokio::task::JoinError),
    /// An RPC berth does not serve yet: answered as such, never with a fake success.
    #[error("{rpc} is not implemented by berth runtime yet")]
    Unimplemented { rpc: &'static str },
    /// A sandbox or container record refused the operation, or could not be stored.
    #[error(transparent)]
    State(#[from] StateError),
    /// CreateContainer names an image that is not pulled for the sandbox's handler.
    #[error("image {image:?} not found for runtime handler {handler:?} (pull it first)")]
    ImageNotFound { image: String, handler: String },
    /// A request the runtime understands but cannot serve (yet): a tty container, say.
    #[error("{0}")]
    Unsupported(String),
    /// The object is in no state for the request (exec in a stopped container).
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("{0}")]
    Timeout(String),
    /// The streaming server refused the request.
    #[error("{}", .0.message())]
    Stream(tonic::Status),
    /// A host operation (mount, file, process) failed.
    #[error("{what}")]
    Host {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// The pod network could not be set up or torn down.
    #[error("network of pod sandbox {sandbox}")]
    Network {
        sandbox: String,
        #[source]
        source: Box<berth_cni::CniError>,
    },
    /// The default pod network could not follow the node's pod CIDR.
    #[error("moving the default pod network to pod CIDR {cidr:?}")]
    PodCidr {
        cidr: String,
        #[source]
        source: Box<berth_cni::ConfigError>,
    },
    /// The OCI runtime failed a verb.
    #[error("{op} container {id}")]
    Oci {
        op: &'static str,
        id: String,
        #[source]
        source: Box<berth_oci::OciError>,
    },
    /// The container's monitor did not get the container created and started.
    #[error("start container {id}")]
    Monitor {
        id: String,
        #[source]
        source: Box<berth_monitor::MonitorError>,
    },
    /// The container's OCI spec could not be generated from its config.
    #[error("container {id} config")]
    Spec {
        id: String,
        #[source]
        source: Box<berth_oci::SpecError>,
    },
}

impl Error {
    pub(crate) fn image(op: &'static str, image: &str, handler: &str, source: ImageError) -> Self {
        Error::Image { op, image: image.to_string(), handler: handler.to_string(), source: Box::new(source) }
    }
}

fn state_code(e: &StateError) -> tonic::Code {
    use tonic::Code;
    match e {
        StateError::NotFound { .. } => Code::NotFound,
        StateError::NameReserved { .. } => Code::AlreadyExists,
        StateError::IllegalTransition { .. } | StateError::SandboxHasContainers { .. } => Code::FailedPrecondition,
        StateError::Invalid { .. } | StateError::Ambiguous { .. } => Code::InvalidArgument,
        // Another RPC holds the record: a concurrency conflict the client may retry.
        StateError::Busy { .. } => Code::Aborted,
        StateError::Decode { .. } | StateError::Io { .. } => Code::Internal,
    }
}

fn image_code(e: &ImageError) -> tonic::Code {
    use tonic::Code;
    match e {
        ImageError::NotFound { .. } => Code::NotFound,
        ImageError::InvalidArgument(_) => Code::InvalidArgument,
        ImageError::Unauthorized { .. } => Code::Unauthenticated,
        ImageError::NoMatchingPlatform { .. } => Code::FailedPrecondition,
        ImageError::DigestMismatch { .. } => Code::DataLoss,
        ImageError::RegistryUnavailable { .. } => Code::Unavailable,
        ImageError::NoSpace { .. } => Code::ResourceExhausted,
        ImageError::Io { .. } | ImageError::Internal(_) => Code::Internal,
    }
}

impl From<Error> for tonic::Status {
    fn from(e: Error) -> Self {
        use tonic::Code;
        let code = match &e {
            Error::UnknownHandler { .. } | Error::InvalidArgument(_) => Code::InvalidArgument,
            Error::Image { source, .. } | Error::FsUsage(source) => image_code(source),
            Error::Task(_) => Code::Internal,
            Error::Unimplemented { .. } => Code::Unimplemented,
            Error::State(e) => state_code(e),
            Error::ImageNotFound { .. } => Code::NotFound,
            Error::Stream(status) => status.code(),
            Error::Unsupported(_) => Code::Unimplemented,
            Error::FailedPrecondition(_) => Code::FailedPrecondition,
            Error::Timeout(_) => Code::DeadlineExceeded,
            Error::Host { .. } | Error::Network { .. } | Error::Monitor { .. } => Code::Internal,
            Error::PodCidr { source, .. } => match **source {
                berth_cni::ConfigError::PodCidr { .. } => Code::InvalidArgument,
                _ => Code::Internal,
            },
            Error::Oci { source, .. } if source.is_not_found() => Code::NotFound,
            Error::Oci { .. } => Code::Internal,
            Error::Spec { source, .. } => match **source {
                berth_oci::SpecError::Host { .. } => Code::Internal,
                _ => Code::InvalidArgument,
            },
        };
        tonic::Status::new(code, e.full_message())
    }
}

impl Error {
    /// The message with its whole chain of causes, for clients, which see no `source()`.
    pub(crate) fn full_message(&self) -> String {
        berth_common::error::error_chain(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    fn status(source: ImageError) -> tonic::Status {
        Error::image("pull", "127.0.0.1:5000/app:1.0", "gvisor", source).into()
    }

    #[test]
    fn each_image_error_maps_to_its_grpc_code() {
        let io = || std::io::Error::other("boom");
        let cases = [
            (ImageError::NotFound { image: "a".into(), handler: "runc".into() }, Code::NotFound),
            (ImageError::InvalidArgument("bad reference".into()), Code::InvalidArgument),
            (
                ImageError::Unauthorized { registry: "r".into(), repository: "p".into(), reason: "no".into() },
                Code::Unauthenticated,
            ),
            (
                ImageError::NoMatchingPlatform { image: "a".into(), wanted: "w".into(), offered: "o".into() },
                Code::FailedPrecondition,
            ),
            (ImageError::DigestMismatch { digest: "d".into(), reason: "r".into() }, Code::DataLoss),
            (ImageError::RegistryUnavailable { registry: "r".into(), source: Box::new(io()) }, Code::Unavailable),
            (ImageError::NoSpace { what: "layer".into() }, Code::ResourceExhausted),
            (ImageError::Io { path: "/x".into(), source: io() }, Code::Internal),
            (ImageError::Internal("x".into()), Code::Internal),
        ];
        for (e, code) in cases {
            assert_eq!(status(e).code(), code);
        }
    }

    #[test]
    fn status_message_names_image_handler_and_the_cause_chain() {
        let s = status(ImageError::RegistryUnavailable {
            registry: "127.0.0.1:5000".into(),
            source: Box::new(std::io::Error::other("connection refused")),
        });
        assert_eq!(
            s.message(),
            r#"pull image "127.0.0.1:5000/app:1.0" for runtime handler "gvisor": registry 127.0.0.1:5000 unavailable: connection refused"#
        );
    }

    #[test]
    fn each_state_error_maps_to_its_grpc_code() {
        use crate::state::{Action, Kind, Op};
        let id = || "0123".to_string();
        let cases = [
            (StateError::NotFound { kind: Kind::Container, id: id() }, Code::NotFound),
            (StateError::NameReserved { kind: Kind::Sandbox, name: "web".into(), by_id: id() }, Code::AlreadyExists),
            (
                StateError::IllegalTransition {
                    kind: Kind::Container,
                    id: id(),
                    from: "running",
                    action: Action::Start,
                },
                Code::FailedPrecondition,
            ),
            (StateError::SandboxHasContainers { id: id(), containers: vec![id()] }, Code::FailedPrecondition),
            (StateError::Ambiguous { kind: Kind::Container, prefix: "0".into(), count: 2 }, Code::InvalidArgument),
            (StateError::Invalid { kind: Kind::Sandbox, reason: "the id is empty" }, Code::InvalidArgument),
            (StateError::Busy { kind: Kind::Container, id: id(), op: Op::Remove }, Code::Aborted),
            (
                StateError::Io { op: "writing", path: "/x".into(), source: std::io::Error::other("disk full") },
                Code::Internal,
            ),
        ];
        for (e, code) in cases {
            assert_eq!(tonic::Status::from(Error::from(e)).code(), code);
        }
    }

    #[test]
    fn a_state_io_error_message_carries_its_cause_once() {
        let e = StateError::Io { op: "writing", path: "/r/c.json".into(), source: std::io::Error::other("disk full") };
        let s = tonic::Status::from(Error::from(e));
        assert_eq!(s.message(), "writing /r/c.json: disk full");
    }

    #[test]
    fn unknown_handler_is_invalid_argument_naming_the_configured_ones() {
        let s: tonic::Status =
            Error::UnknownHandler { handler: "kata".into(), known: vec!["gvisor".into(), "runc".into()] }.into();
        assert_eq!(s.code(), Code::InvalidArgument);
        assert_eq!(s.message(), r#"unknown runtime handler "kata" (configured handlers: gvisor, runc)"#);
    }
}
