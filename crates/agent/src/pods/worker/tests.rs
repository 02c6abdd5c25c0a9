//! Unit tests of the pod worker on a fake runtime.
