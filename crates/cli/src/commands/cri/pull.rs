//! `berth cri pull`: pulls an image for a runtime handler; a progress bar per layer on a
//! terminal (berth's streaming pull), crictl's `Image is up to date for <id>` line either way.

use std::collections::HashMap;
use std::io::IsTerminal;

use anyhow::{Context as _, bail};
use berth_runtime::proto;
use berth_runtime::proto::pull_event::Event;
use berth_runtime::proto::pull_progress_client::PullProgressClient;
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use k8s_cri::v1 as cri;

use super::{Context, image_spec, rpc_error};

#[derive(clap::Args)]
pub struct Args {
    /// Runtime handler to pull for; the runtime's default when not given.
    #[arg(long, value_name = "HANDLER", default_value = "")]
    runtime: String,
    /// Registry credentials as USERNAME[:PASSWORD].
    #[arg(long, value_name = "USERNAME[:PASSWORD]", conflicts_with = "auth")]
    creds: Option<String>,
    /// Registry auth string: base64 of USERNAME:PASSWORD.
    #[arg(long, value_name = "AUTH_STRING")]
    auth: Option<String>,
    /// Give up pulling after this long (`0` waits forever).
    #[arg(long, default_value = "0s", value_parser = super::parse_duration)]
    pull_timeout: std::time::Duration,
    image: String,
}

pub async fn run(ctx: &Context, args: Args) -> anyhow::Result<()> {
    let auth = auth_config(args.creds.as_deref(), args.auth.as_deref())?;
    let pull = async {
        if std::io::stdout().is_terminal()
            && let Some(id) = pull_with_progress(ctx, &args.image, &args.runtime, auth.clone()).await?
        {
            return Ok(id);
        }
        let mut client = ctx.images().await?;
        let req =
            cri::PullImageRequest { image: Some(image_spec(&args.image, &args.runtime)), auth, sandbox_config: None };
        let resp = client.pull_image(req).await.map_err(rpc_error)?;
        anyhow::Ok(resp.into_inner().image_ref)
    };
    let id = if args.pull_timeout.is_zero() {
        pull.await
    } else {
        tokio::time::timeout(args.pull_timeout, pull).await.map_err(|_| anyhow::anyhow!("timed out"))?
    }
    .context("pulling image")?;
    println!("Image is up to date for {id}");
    Ok(())
}

/// crictl's rules: `--creds user[:password]` (an empty password is allowed), or `--auth`.
pub(super) fn auth_config(creds: Option<&str>, auth: Option<&str>) -> anyhow::Result<Option<cri::AuthConfig>> {
    if let Some(creds) = creds {
        let (user, password) = creds.split_once(':').unwrap_or((creds, ""));
        if user.is_empty() {
            bail!("--creds: the user name is empty");
        }
        return Ok(Some(cri::AuthConfig { username: user.into(), password: password.into(), ..Default::default() }));
    }
    Ok(auth.map(|a| cri::AuthConfig { auth: a.into(), ..Default::default() }))
}

/// The pull through berth's streaming service, drawing bars; `None` when the server does not
/// offer it (another CRI runtime), so the caller falls back to CRI `PullImage`.
async fn pull_with_progress(
    ctx: &Context,
    image: &str,
    handler: &str,
    auth: Option<cri::AuthConfig>,
) -> anyhow::Result<Option<String>> {
    let mut client = PullProgressClient::new(ctx.image_channel().await?);
    let auth = auth.map(proto::Auth::from);
    let req = proto::PullRequest { image: image.into(), handler: handler.into(), auth };
    let mut stream = match client.pull(req).await {
        Ok(s) => s.into_inner(),
        Err(s) if s.code() == tonic::Code::Unimplemented => return Ok(None),
        Err(s) => return Err(rpc_error(s)),
    };
    let bars = Bars::new();
    loop {
        match stream.message().await {
            Ok(Some(proto::PullEvent { event: Some(event) })) => {
                if let Event::Done(done) = event {
                    bars.finish();
                    return Ok(Some(done.image_ref));
                }
                bars.update(event);
            }
            Ok(Some(proto::PullEvent { event: None })) => {}
            Ok(None) => {
                bars.finish();
                bail!("the runtime ended the pull without a result");
            }
            Err(s) => {
                bars.finish();
                return Err(rpc_error(s));
            }
        }
    }
}

/// One byte-counting bar per layer.
struct Bars {
    multi: MultiProgress,
    layers: std::cell::RefCell<HashMap<String, ProgressBar>>,
    style: ProgressStyle,
}

impl Bars {
    fn new() -> Self {
        let style =
            ProgressStyle::with_template("{prefix:.bold} [{bar:40.cyan/blue}] {bytes:>10}/{total_bytes:<10} {msg}")
                .expect("static template")
                .progress_chars("=> ");
        Bars { multi: MultiProgress::new(), layers: Default::default(), style }
    }

    fn bar(&self, digest: &str, size: u64) -> ProgressBar {
        let mut layers = self.layers.borrow_mut();
        layers
            .entry(digest.to_string())
            .or_insert_with(|| {
                let bar = self.multi.add(ProgressBar::new(size).with_style(self.style.clone()));
                bar.set_prefix(short_digest(digest));
                bar.set_message("waiting");
                bar
            })
            .clone()
    }

    fn update(&self, event: Event) {
        match event {
            Event::Resolved(r) => {
                for l in r.layers {
                    self.bar(&l.digest, l.size);
                }
            }
            Event::Downloading(d) => {
                let bar = self.bar(&d.digest, d.total);
                bar.set_length(d.total);
                bar.set_position(d.done);
                bar.set_message("downloading");
            }
            Event::Downloaded(d) => {
                let bar = self.bar(&d.digest, 0);
                bar.set_position(bar.length().unwrap_or(0));
                bar.set_message("unpacking");
            }
            Event::Unpacked(d) => {
                let bar = self.bar(&d.digest, 0);
                bar.set_position(bar.length().unwrap_or(0));
                bar.finish_with_message("done");
            }
            Event::Done(_) => {}
        }
    }

    fn finish(&self) {
        for bar in self.layers.borrow().values() {
            if !bar.is_finished() {
                bar.abandon();
            }
        }
    }
}

/// `sha256:0123456789abcdef…` → `0123456789ab`, as docker labels layers.
fn short_digest(digest: &str) -> String {
    digest.split_once(':').map_or(digest, |(_, hex)| hex).chars().take(12).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creds_split_into_user_and_password() {
        let a = auth_config(Some("user:pa:ss"), None).unwrap().unwrap();
        assert_eq!((a.username.as_str(), a.password.as_str()), ("user", "pa:ss"));
        let a = auth_config(Some("user"), None).unwrap().unwrap();
        assert_eq!(a.password, "");
        assert!(auth_config(Some(":x"), None).is_err());
        assert_eq!(auth_config(None, Some("dTpw")).unwrap().unwrap().auth, "dTpw");
        assert!(auth_config(None, None).unwrap().is_none());
    }

    #[test]
    fn layer_labels_are_twelve_hex_digits() {
        assert_eq!(short_digest("sha256:0123456789abcdef"), "0123456789ab");
    }
}
