//! The CRI v1 runtime: serves ImageService (and RuntimeService) on a unix socket.
