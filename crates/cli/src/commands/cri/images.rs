//! `berth cri images`: crictl's image list with a RUNTIME column (the handler each image was
//! pulled for; the default handler's name when the runtime leaves it empty).

use k8s_cri::v1 as cri;

use super::output::{self, Format};
use super::{Context, image_spec, rpc_error};

#[derive(clap::Args)]
pub struct Args {
    /// Only images of this runtime handler; all handlers when not given.
    #[arg(long, value_name = "HANDLER", default_value = "")]
    runtime: String,
    /// Only show image IDs.
    #[arg(short, long)]
    quiet: bool,
    /// Output format.
    #[arg(short, long, value_enum, default_value = "table")]
    output: Format,
    /// Show digests.
    #[arg(long)]
    digests: bool,
    /// Show output without truncating the ID.
    #[arg(long)]
    no_trunc: bool,
    /// Only images matching this reference (repository, tag, digest or id).
    image: Option<String>,
}

pub async fn run(ctx: &Context, args: Args) -> anyhow::Result<()> {
    let mut client = ctx.images().await?;
    let filter = (!args.runtime.is_empty() || args.image.is_some())
        .then(|| cri::ImageFilter { image: Some(image_spec(args.image.as_deref().unwrap_or(""), &args.runtime)) });
    let resp =
        client.list_images(ctx.request(cri::ListImagesRequest { filter })).await.map_err(rpc_error)?.into_inner();

    if args.quiet {
        for i in &resp.images {
            println!("{}", i.id);
        }
        return Ok(());
    }
    match args.output {
        Format::Json | Format::Yaml => output::print(&output::list_images(&resp), args.output),
        Format::Table => {
            let needs_default = resp.images.iter().any(|i| handler_of(i).is_empty());
            let default = if needs_default { ctx.default_handler().await } else { String::new() };
            print!("{}", table(&resp.images, &default, args.digests, args.no_trunc));
            Ok(())
        }
    }
}

fn handler_of(i: &cri::Image) -> &str {
    i.spec.as_ref().map_or("", |s| s.runtime_handler.as_str())
}

/// crictl's table, with RUNTIME after IMAGE ID: `IMAGE TAG [DIGEST] IMAGE ID RUNTIME SIZE`.
fn table(images: &[cri::Image], default_handler: &str, digests: bool, no_trunc: bool) -> String {
    let mut header = vec!["IMAGE", "TAG"];
    if digests {
        header.push("DIGEST");
    }
    header.extend(["IMAGE ID", "RUNTIME", "SIZE"]);
    let mut rows = vec![header.into_iter().map(String::from).collect::<Vec<_>>()];
    for i in images {
        let (name, mut digest) = output::repo_digest(&i.repo_digests);
        let mut id = i.id.clone();
        if !no_trunc {
            id = output::truncate_id(&id, "sha256:");
            digest = output::truncate_id(&digest, "sha256:");
        }
        let handler = match handler_of(i) {
            "" => default_handler,
            h => h,
        };
        for (repo, tag) in output::repo_tag_pairs(&i.repo_tags, &name) {
            let mut row = vec![repo, tag];
            if digests {
                row.push(digest.clone());
            }
            row.extend([id.clone(), handler.to_string(), output::human_size(i.size)]);
            rows.push(row);
        }
    }
    output::table(&rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(handler: &str) -> cri::Image {
        cri::Image {
            id: "sha256:4a2fb1c0d3e5f60718293a4b5c6d7e8f".into(),
            repo_tags: vec!["127.0.0.1:5000/multi:1.0".into()],
            repo_digests: vec!["127.0.0.1:5000/multi@sha256:99887766554433221100".into()],
            size: 2_231_050,
            spec: Some(cri::ImageSpec { runtime_handler: handler.into(), ..Default::default() }),
            ..Default::default()
        }
    }

    #[test]
    fn runtime_column_follows_image_id_and_is_never_blank() {
        let out = table(&[image("gvisor"), image("")], "runc", false, false);
        let lines: Vec<_> = out.lines().collect();
        assert_eq!(lines[0].split_whitespace().collect::<Vec<_>>(), ["IMAGE", "TAG", "IMAGE", "ID", "RUNTIME", "SIZE"]);
        assert_eq!(
            lines[1].split_whitespace().collect::<Vec<_>>(),
            ["127.0.0.1:5000/multi", "1.0", "4a2fb1c0d3e5f", "gvisor", "2.23MB"]
        );
        assert_eq!(lines[2].split_whitespace().nth(3), Some("runc"));
        assert_eq!(lines[0].find("RUNTIME"), lines[1].find("gvisor"));
    }

    #[test]
    fn digests_and_untruncated_ids_on_request() {
        let out = table(&[image("runc")], "runc", true, true);
        let row: Vec<_> = out.lines().nth(1).unwrap().split_whitespace().collect();
        assert_eq!(row[2], "sha256:99887766554433221100");
        assert_eq!(row[3], "sha256:4a2fb1c0d3e5f60718293a4b5c6d7e8f");
    }
}
