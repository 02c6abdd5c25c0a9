//! The state layer's one error type, and the words its messages are built from.

use std::fmt;
use std::io;
use std::path::PathBuf;

/// Which kind of record an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Sandbox,
    Container,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Sandbox => "pod sandbox",
            Kind::Container => "container",
        })
    }
}

/// A verb of the state machine, as an illegal transition names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Start,
    Stop,
    Remove,
    MarkExited,
    MarkUnknown,
    MarkReady,
    CreateContainerIn,
    StartContainerIn,
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Action::Start => "start",
            Action::Stop => "stop",
            Action::Remove => "remove",
            Action::MarkExited => "mark exited",
            Action::MarkUnknown => "mark unknown",
            Action::MarkReady => "mark ready",
            Action::CreateContainerIn => "create a container in",
            Action::StartContainerIn => "start a container in",
        })
    }
}

/// A slow operation holding a [`Claim`](super::Claim) on a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Create,
    Start,
    Stop,
    Remove,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Completes "is already being …".
        f.write_str(match self {
            Op::Create => "created",
            Op::Start => "started",
            Op::Stop => "stopped",
            Op::Remove => "removed",
        })
    }
}

/// Why a state operation failed. `cri::Error` maps each variant to one gRPC code.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// A malformed id or record (empty id, missing metadata name): `InvalidArgument`.
    #[error("invalid {kind}: {reason}")]
    Invalid { kind: Kind, reason: &'static str },
    /// No record has this id or id prefix: `NotFound`.
    #[error("{kind} {id:?} not found")]
    NotFound { kind: Kind, id: String },
    /// An id prefix matches more than one record: `InvalidArgument`.
    #[error("{kind} id prefix {prefix:?} is ambiguous: it matches {count} ids")]
    Ambiguous { kind: Kind, prefix: String, count: usize },
    /// The CRI name (pod name, namespace, uid, attempt — or sandbox, container name, attempt) is
    /// held by another record until that one is removed: `AlreadyExists`.
    #[error("the {kind} name {name:?} is already in use by {by_id}")]
    NameReserved { kind: Kind, name: String, by_id: String },
    /// The state machine forbids `action` in the record's current state: `FailedPrecondition`.
    #[error("cannot {action} {kind} {id}: it is {from}")]
    IllegalTransition { kind: Kind, id: String, from: &'static str, action: Action },
    /// A sandbox cannot be removed while containers still refer to it: `FailedPrecondition`.
    #[error("pod sandbox {id} still has {} container(s): {}", containers.len(), containers.join(", "))]
    SandboxHasContainers { id: String, containers: Vec<String> },
    /// Another slow operation holds the record: `Aborted`, so the caller may retry.
    #[error("{kind} {id} is already being {op}")]
    Busy { kind: Kind, id: String, op: Op },
    /// A stored CRI config no longer decodes into the current CRI types: `Internal`.
    #[error("decoding the stored config of {kind} {id}")]
    Decode {
        kind: Kind,
        id: String,
        #[source]
        source: serde_json::Error,
    },
    /// Reading or writing a record's file failed; `op` names the step: `Internal`.
    #[error("{op} {path}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl StateError {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(io::Error) -> StateError {
        let path = path.into();
        move |source| StateError::Io { op, path, source }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_read_as_containerd_style_sentences() {
        let e = StateError::NameReserved { kind: Kind::Container, name: "web".into(), by_id: "abc".into() };
        assert_eq!(e.to_string(), r#"the container name "web" is already in use by abc"#);
        let e = StateError::IllegalTransition {
            kind: Kind::Container,
            id: "abc".into(),
            from: "running",
            action: Action::Start,
        };
        assert_eq!(e.to_string(), "cannot start container abc: it is running");
        let e = StateError::IllegalTransition {
            kind: Kind::Sandbox,
            id: "def".into(),
            from: "not ready",
            action: Action::CreateContainerIn,
        };
        assert_eq!(e.to_string(), "cannot create a container in pod sandbox def: it is not ready");
        let e = StateError::Busy { kind: Kind::Container, id: "abc".into(), op: Op::Remove };
        assert_eq!(e.to_string(), "container abc is already being removed");
        let e = StateError::Ambiguous { kind: Kind::Sandbox, prefix: "a".into(), count: 3 };
        assert_eq!(e.to_string(), r#"pod sandbox id prefix "a" is ambiguous: it matches 3 ids"#);
    }
}
