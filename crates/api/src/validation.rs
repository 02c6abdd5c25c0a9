//! Generic validation: DNS-1123 names, label and annotation syntax, object metadata.
// STUB: to be implemented.
