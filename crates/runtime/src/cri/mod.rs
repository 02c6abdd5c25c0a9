//! The CRI v1 service: the shared state every RPC works on and handler resolution; the image and
//! runtime halves live in submodules as plain async methods, and [`grpc`] adapts them to tonic.

use std::sync::Arc;

use berth_image::Images;

use crate::config::{Config, Handler};

mod error;
pub mod grpc;
mod image;
mod runtime;

pub use error::Error;
pub use image::PullTask;

/// What the CRI services share: the configuration and the image store.
pub struct Cri {
    config: Config,
    images: Arc<Images>,
}

impl Cri {
    /// `images` must have been opened with `config.images_config()`.
    pub fn new(config: Config, images: Arc<Images>) -> Self {
        Cri { config, images }
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// `""` is the default handler; an unknown name is `InvalidArgument` naming the configured ones.
    pub fn handler(&self, name: &str) -> Result<&Handler, Error> {
        self.config.handler(name).ok_or_else(|| Error::UnknownHandler {
            handler: name.to_string(),
            known: self.config.handlers.keys().cloned().collect(),
        })
    }

    /// Runs a blocking image-store call off the async workers.
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Images) -> Result<T, Error> + Send + 'static,
    ) -> Result<T, Error> {
        let images = Arc::clone(&self.images);
        tokio::task::spawn_blocking(move || f(&images)).await.map_err(Error::Task)?
    }
}
