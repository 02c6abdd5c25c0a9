//! Test environment for berth's own tests and benchmarks: a real registry (Debian's
//! `docker-registry`) on loopback with images generated here, optionally behind basic auth or a
//! token server of our own with TLS; never used at run time.
// SKELETON: the API below is the contract; bodies are to be implemented.
