//! Unpacking one layer blob into its own directory (`layers/<chain id hex>`), in the form overlayfs
//! takes as a lowerdir, and checking its diff_id on the way.
//!
//! - The blob's compression is read from its first bytes (gzip, zstd, or a plain tar).
//! - Entries keep ownership, modes, mtimes, symlinks, hardlinks, device nodes and xattrs (the
//!   `tar` crate does the per-entry work, and refuses to write through symlinks leaving the layer).
//! - OCI whiteouts become overlayfs ones: `.wh.<name>` → a 0/0 character device `<name>`,
//!   `.wh..wh..opq` → `trusted.overlay.opaque=y` on its directory. Both need root.
//! - An entry whose path has a `..` component is an error, not skipped: such a layer is hostile.
//! - Everything goes into `layers/.tmp-…` first; the directory is synced and renamed into place
//!   only after the diff_id (sha256 of the whole uncompressed stream) matched. A crash leaves a
//!   temp directory that [`crate::Images::open`] removes.

use std::io::{BufRead, BufReader, Read};
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, SystemTime};

use sha2::{Digest as _, Sha256};
use tracing::debug;

use crate::ImageError;
use crate::content::{digest_hex, io_error, sync_dir, unique_suffix};
use crate::manifest::Compression;

const WHITEOUT_PREFIX: &str = ".wh.";
const OPAQUE_WHITEOUT: &str = ".wh..wh..opq";
pub(crate) const TMP_PREFIX: &str = ".tmp-";

/// What unpacking one layer produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Unpacked {
    /// Bytes of the uncompressed tar stream.
    pub uncompressed: u64,
    /// False if the directory was already there (from another image or handler).
    pub fresh: bool,
}

/// The chain IDs of a layer stack: `chain(0) = diff_id(0)`,
/// `chain(n) = sha256(chain(n-1) + " " + diff_id(n))`.
pub(crate) fn chain_ids(diff_ids: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(diff_ids.len());
    for diff_id in diff_ids {
        let next = match out.last() {
            None => diff_id.clone(),
            Some(parent) => format!("sha256:{}", hex::encode(Sha256::digest(format!("{parent} {diff_id}").as_bytes()))),
        };
        out.push(next);
    }
    out
}

pub(crate) fn layer_dir(layers: &Path, chain_id: &str) -> PathBuf {
    layers.join(digest_hex(chain_id))
}

/// Unpacks `blob` as the layer `chain_id` under `layers`, checking `diff_id`. Blocking.
/// `media_type` is only advisory: the compression actually used is read from the blob's magic bytes.
pub(crate) fn unpack_layer(
    blob: &Path,
    media_type: &str,
    layers: &Path,
    chain_id: &str,
    diff_id: &str,
) -> Result<Unpacked, ImageError> {
    let target = layer_dir(layers, chain_id);
    if target.is_dir() {
        return Ok(Unpacked { uncompressed: 0, fresh: false });
    }
    let tmp = layers.join(format!("{TMP_PREFIX}{}-{}", digest_hex(chain_id), unique_suffix()));
    let result = unpack_into(blob, media_type, &tmp, diff_id);
    let uncompressed = match result {
        Ok(n) => n,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(e);
        }
    };
    let synced = std::fs::File::open(&tmp)
        .map_err(|e| io_error(&tmp, chain_id, e))
        .and_then(|dir| nix::unistd::syncfs(&dir).map_err(|e| io_error(&tmp, chain_id, std::io::Error::from(e))));
    if let Err(e) = synced {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    match std::fs::rename(&tmp, &target) {
        Ok(()) => {}
        // Someone else (another pull of the same layer) finished first: theirs is as good.
        Err(_) if target.is_dir() => {
            let _ = std::fs::remove_dir_all(&tmp);
            return Ok(Unpacked { uncompressed, fresh: false });
        }
        Err(e) => {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(io_error(&target, chain_id, e));
        }
    }
    sync_dir(layers)?;
    debug!(chain_id, diff_id, uncompressed, "layer unpacked");
    Ok(Unpacked { uncompressed, fresh: true })
}

/// Hashes and counts everything read through it.
struct HashingReader<R> {
    inner: R,
    hasher: Sha256,
    count: u64,
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }
}

fn unpack_into(blob: &Path, media_type: &str, dir: &Path, diff_id: &str) -> Result<u64, ImageError> {
    let io = |path: &Path, e: std::io::Error| io_error(path, &format!("layer {diff_id}"), e);
    std::fs::create_dir(dir).map_err(|e| io(dir, e))?;
    let file = std::fs::File::open(blob).map_err(|e| io(blob, e))?;
    let mut reader = BufReader::with_capacity(1 << 20, file);
    let head = reader.fill_buf().map_err(|e| io(blob, e))?;
    let actual = Compression::sniff(head).unwrap_or(Compression::None);
    let claimed = Compression::from_media_type(media_type);
    if !media_type.is_empty() && actual != claimed {
        debug!(diff_id, media_type, ?actual, "layer media type does not match its content; going by the content");
    }
    let decoder: Box<dyn Read> = match actual {
        Compression::Gzip => Box::new(flate2::bufread::MultiGzDecoder::new(reader)),
        Compression::Zstd => Box::new(zstd::stream::read::Decoder::with_buffer(reader).map_err(|e| io(blob, e))?),
        Compression::None => Box::new(reader),
    };
    let mut hashing = HashingReader { inner: decoder, hasher: Sha256::new(), count: 0 };
    let mut dir_times: Vec<(PathBuf, u64)> = Vec::new();
    {
        let mut archive = tar::Archive::new(&mut hashing);
        archive.set_preserve_permissions(true);
        archive.set_preserve_ownerships(true);
        archive.set_preserve_mtime(true);
        archive.set_unpack_xattrs(true);
        archive.set_overwrite(true);
        let entries = archive.entries().map_err(|e| corrupt_layer(diff_id, e))?;
        for entry in entries {
            let mut entry = entry.map_err(|e| corrupt_layer(diff_id, e))?;
            unpack_entry(&mut entry, dir, diff_id, &mut dir_times)?;
        }
    }
    // The diff_id covers the whole stream, including the end-of-archive blocks and any padding.
    std::io::copy(&mut hashing, &mut std::io::sink()).map_err(|e| corrupt_layer(diff_id, e))?;
    let actual = format!("sha256:{}", hex::encode(hashing.hasher.finalize()));
    if actual != diff_id {
        return Err(ImageError::DigestMismatch {
            digest: diff_id.to_string(),
            reason: format!("uncompressed layer hashes to {actual}"),
        });
    }
    // Directory mtimes last, deepest first, since creating entries inside them changed them.
    for (path, mtime) in dir_times.iter().rev() {
        let time = SystemTime::UNIX_EPOCH + Duration::from_secs(*mtime);
        let set = std::fs::File::open(path)
            .and_then(|d| d.set_times(std::fs::FileTimes::new().set_modified(time).set_accessed(time)));
        set.map_err(|e| io(path, e))?;
    }
    Ok(hashing.count)
}

fn corrupt_layer(diff_id: &str, e: std::io::Error) -> ImageError {
    if e.raw_os_error() == Some(nix::libc::ENOSPC) {
        return ImageError::NoSpace { what: format!("layer {diff_id}") };
    }
    ImageError::DigestMismatch { digest: diff_id.to_string(), reason: format!("unreadable layer archive: {e}") }
}

fn unsafe_entry(diff_id: &str, path: &Path, why: &str) -> ImageError {
    ImageError::InvalidArgument(format!("layer {diff_id} has unsafe entry {}: {why}", path.display()))
}

fn unpack_entry<R: Read>(
    entry: &mut tar::Entry<'_, R>,
    dir: &Path,
    diff_id: &str,
    dir_times: &mut Vec<(PathBuf, u64)>,
) -> Result<(), ImageError> {
    let path = entry.path().map_err(|e| corrupt_layer(diff_id, e))?.into_owned();
    // Absolute paths are taken as relative to the layer root; `..` is refused outright.
    let mut relative = PathBuf::new();
    for component in path.components() {
        match component {
            Component::Normal(part) => relative.push(part),
            Component::ParentDir => return Err(unsafe_entry(diff_id, &path, "path leaves the layer")),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    let kind = entry.header().entry_type();
    if kind.is_hard_link()
        && let Some(link) = entry.link_name().map_err(|e| corrupt_layer(diff_id, e))?
        && link.components().any(|c| c == Component::ParentDir)
    {
        return Err(unsafe_entry(diff_id, &path, "hard link target leaves the layer"));
    }
    let name = relative.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    if name == OPAQUE_WHITEOUT {
        let parent = safe_dir(dir, relative.parent().unwrap_or(Path::new("")), diff_id, &path)?;
        xattr::set(&parent, "trusted.overlay.opaque", b"y").map_err(|e| io_error(&parent, "opaque whiteout", e))?;
        return Ok(());
    }
    if let Some(hidden) = name.strip_prefix(WHITEOUT_PREFIX) {
        if hidden.is_empty() || hidden == "." || hidden == ".." {
            return Err(unsafe_entry(diff_id, &path, "bad whiteout name"));
        }
        let parent = safe_dir(dir, relative.parent().unwrap_or(Path::new("")), diff_id, &path)?;
        let target = parent.join(hidden);
        if let Ok(meta) = std::fs::symlink_metadata(&target) {
            let removed = if meta.is_dir() { std::fs::remove_dir_all(&target) } else { std::fs::remove_file(&target) };
            removed.map_err(|e| io_error(&target, "whiteout", e))?;
        }
        nix::sys::stat::mknod(
            &target,
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::empty(),
            nix::sys::stat::makedev(0, 0),
        )
        .map_err(|e| io_error(&target, "whiteout", std::io::Error::from(e)))?;
        return Ok(());
    }
    if relative.as_os_str().is_empty() {
        // The layer root itself (`./`): the tar crate skips it, so apply its metadata here.
        if kind.is_dir() {
            let header = entry.header();
            let mode = header.mode().unwrap_or(0o755);
            let (uid, gid) = (header.uid().unwrap_or(0), header.gid().unwrap_or(0));
            nix::unistd::chown(
                dir,
                Some(nix::unistd::Uid::from_raw(uid as u32)),
                Some(nix::unistd::Gid::from_raw(gid as u32)),
            )
            .map_err(|e| io_error(dir, "layer root", std::io::Error::from(e)))?;
            let perms = <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(mode);
            std::fs::set_permissions(dir, perms).map_err(|e| io_error(dir, "layer root", e))?;
            dir_times.push((dir.to_path_buf(), header.mtime().unwrap_or(0)));
        }
        return Ok(());
    }
    let mtime = entry.header().mtime().unwrap_or(0);
    if kind.is_character_special() || kind.is_block_special() || kind.is_fifo() {
        // The tar crate would write these as regular files.
        return make_special(entry.header(), dir, &relative, diff_id, &path);
    }
    match entry.unpack_in(dir) {
        Ok(true) => {}
        Ok(false) => return Err(unsafe_entry(diff_id, &path, "path leaves the layer")),
        Err(e) if e.raw_os_error() == Some(nix::libc::ENOSPC) || e.to_string().contains("No space left") => {
            return Err(ImageError::NoSpace { what: format!("layer {diff_id}") });
        }
        Err(e) if e.to_string().contains("outside of destination") => {
            return Err(unsafe_entry(diff_id, &path, "writes through a link that leaves the layer"));
        }
        Err(e) => return Err(io_error(&dir.join(&relative), &format!("layer {diff_id}"), e)),
    }
    if kind.is_dir() {
        dir_times.push((dir.join(&relative), mtime));
    }
    Ok(())
}

/// A device node or fifo, with its owner, mode and mtime.
fn make_special(
    header: &tar::Header,
    dir: &Path,
    relative: &Path,
    diff_id: &str,
    path: &Path,
) -> Result<(), ImageError> {
    use nix::sys::stat::{Mode, SFlag, UtimensatFlags, makedev, mknod, utimensat};
    let parent = safe_dir(dir, relative.parent().unwrap_or(Path::new("")), diff_id, path)?;
    let target = parent.join(relative.file_name().unwrap_or_default());
    let fail = |e: nix::Error| io_error(&target, &format!("layer {diff_id}"), std::io::Error::from(e));
    if let Ok(meta) = std::fs::symlink_metadata(&target) {
        let removed = if meta.is_dir() { std::fs::remove_dir_all(&target) } else { std::fs::remove_file(&target) };
        removed.map_err(|e| io_error(&target, "layer entry", e))?;
    }
    let kind = header.entry_type();
    let flag = if kind.is_character_special() {
        SFlag::S_IFCHR
    } else if kind.is_block_special() {
        SFlag::S_IFBLK
    } else {
        SFlag::S_IFIFO
    };
    let major = header.device_major().ok().flatten().unwrap_or(0);
    let minor = header.device_minor().ok().flatten().unwrap_or(0);
    let mode = header.mode().unwrap_or(0o600);
    mknod(&target, flag, Mode::from_bits_truncate(mode & 0o7777), makedev(major.into(), minor.into())).map_err(fail)?;
    let (uid, gid) = (header.uid().unwrap_or(0) as u32, header.gid().unwrap_or(0) as u32);
    nix::unistd::fchownat(
        nix::fcntl::AT_FDCWD,
        &target,
        Some(nix::unistd::Uid::from_raw(uid)),
        Some(nix::unistd::Gid::from_raw(gid)),
        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .map_err(fail)?;
    // mknod applies the umask and chown clears set-id bits: set the mode again.
    nix::sys::stat::fchmodat(
        nix::fcntl::AT_FDCWD,
        &target,
        Mode::from_bits_truncate(mode & 0o7777),
        nix::sys::stat::FchmodatFlags::FollowSymlink,
    )
    .map_err(fail)?;
    let time = nix::sys::time::TimeSpec::new(header.mtime().unwrap_or(0) as i64, 0);
    utimensat(nix::fcntl::AT_FDCWD, &target, &time, &time, UtimensatFlags::NoFollowSymlink).map_err(fail)
}

/// Creates `relative` under `root` one component at a time, refusing to follow symlinks.
fn safe_dir(root: &Path, relative: &Path, diff_id: &str, entry: &Path) -> Result<PathBuf, ImageError> {
    let mut current = root.to_path_buf();
    for component in relative.components() {
        current.push(component);
        match std::fs::symlink_metadata(&current) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => return Err(unsafe_entry(diff_id, entry, "parent is not a directory")),
            Err(_) => std::fs::create_dir(&current).map_err(|e| io_error(&current, "layer directory", e))?,
        }
    }
    Ok(current)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};

    struct Layer {
        builder: tar::Builder<Vec<u8>>,
    }

    impl Layer {
        fn new() -> Self {
            Layer { builder: tar::Builder::new(Vec::new()) }
        }

        fn header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(kind);
            h.set_mode(mode);
            h.set_size(size);
            h.set_mtime(1_600_000_000);
            h.set_uid(0);
            h.set_gid(0);
            h
        }

        fn dir(mut self, path: &str) -> Self {
            let mut h = Self::header(tar::EntryType::Directory, 0o755, 0);
            self.builder.append_data(&mut h, path, std::io::empty()).unwrap();
            self
        }

        fn file(mut self, path: &str, data: &[u8], mode: u32, uid: u64) -> Self {
            let mut h = Self::header(tar::EntryType::Regular, mode, data.len() as u64);
            h.set_uid(uid);
            h.set_gid(uid);
            self.builder.append_data(&mut h, path, data).unwrap();
            self
        }

        fn link(mut self, kind: tar::EntryType, path: &str, target: &str) -> Self {
            let mut h = Self::header(kind, 0o777, 0);
            self.builder.append_link(&mut h, path, target).unwrap();
            self
        }

        /// An entry whose name is written raw into the header (the builder refuses `..`).
        fn raw_file(mut self, path: &str) -> Self {
            let mut h = Self::header(tar::EntryType::Regular, 0o644, 1);
            h.as_old_mut().name[..path.len()].copy_from_slice(path.as_bytes());
            h.set_cksum();
            self.builder.append(&h, &b"x"[..]).unwrap();
            self
        }

        fn finish(self) -> Vec<u8> {
            self.builder.into_inner().unwrap()
        }
    }

    fn diff_id(tar: &[u8]) -> String {
        format!("sha256:{}", hex::encode(Sha256::digest(tar)))
    }

    /// Writes `blob` and unpacks it as a one-layer chain.
    fn unpack(tmp: &Path, blob: &[u8], diff_id: &str) -> Result<PathBuf, ImageError> {
        let path = tmp.join(format!("blob-{}", unique_suffix()));
        std::fs::write(&path, blob).unwrap();
        let layers = tmp.join("layers");
        std::fs::create_dir_all(&layers).unwrap();
        unpack_layer(&path, "", &layers, diff_id, diff_id)?;
        Ok(layer_dir(&layers, diff_id))
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut enc, data).unwrap();
        enc.finish().unwrap()
    }

    #[test]
    fn files_keep_modes_owners_mtimes_and_links() {
        let tmp = tempfile::tempdir().unwrap();
        let tar = Layer::new()
            .dir("etc/")
            .file("etc/passwd", b"root:x:0:0", 0o640, 0)
            .file("home/user/data", b"mine", 0o4755, 1000)
            .link(tar::EntryType::Symlink, "etc/link", "/etc/passwd")
            .link(tar::EntryType::Link, "etc/hard", "etc/passwd")
            .finish();
        let dir = unpack(tmp.path(), &gzip(&tar), &diff_id(&tar)).unwrap();
        let passwd = std::fs::metadata(dir.join("etc/passwd")).unwrap();
        assert_eq!(passwd.permissions().mode() & 0o7777, 0o640);
        assert_eq!(passwd.mtime(), 1_600_000_000);
        let data = std::fs::metadata(dir.join("home/user/data")).unwrap();
        assert_eq!((data.uid(), data.gid()), (1000, 1000));
        assert_eq!(data.permissions().mode() & 0o7777, 0o4755);
        assert_eq!(std::fs::read_link(dir.join("etc/link")).unwrap(), Path::new("/etc/passwd"));
        assert_eq!(std::fs::metadata(dir.join("etc/hard")).unwrap().ino(), passwd.ino());
        assert_eq!(std::fs::metadata(dir.join("etc")).unwrap().mtime(), 1_600_000_000);
    }

    #[test]
    fn whiteouts_become_overlay_character_devices_and_opaque_xattrs() {
        let tmp = tempfile::tempdir().unwrap();
        let tar = Layer::new()
            .dir("etc/")
            .file("etc/.wh.hosts", b"", 0o644, 0)
            .dir("var/cache/")
            .file("var/cache/.wh..wh..opq", b"", 0o644, 0)
            .file("var/cache/new", b"n", 0o644, 0)
            .file("gone/.wh.deep", b"", 0o644, 0)
            .finish();
        let dir = unpack(tmp.path(), &tar, &diff_id(&tar)).unwrap();
        let hosts = std::fs::symlink_metadata(dir.join("etc/hosts")).unwrap();
        assert!(hosts.file_type().is_char_device());
        assert_eq!(hosts.rdev(), 0);
        assert!(!dir.join("etc/.wh.hosts").exists());
        assert_eq!(xattr::get(dir.join("var/cache"), "trusted.overlay.opaque").unwrap(), Some(b"y".to_vec()));
        assert!(!dir.join("var/cache/.wh..wh..opq").exists());
        assert!(dir.join("var/cache/new").is_file());
        assert!(std::fs::symlink_metadata(dir.join("gone/deep")).unwrap().file_type().is_char_device());
    }

    #[test]
    fn zstd_and_plain_layers_unpack_too() {
        let tmp = tempfile::tempdir().unwrap();
        let tar = Layer::new().file("a", b"zstd!", 0o644, 0).finish();
        let dir = unpack(tmp.path(), &zstd::encode_all(&tar[..], 3).unwrap(), &diff_id(&tar)).unwrap();
        assert_eq!(std::fs::read(dir.join("a")).unwrap(), b"zstd!");
        let tar = Layer::new().file("b", b"plain", 0o644, 0).finish();
        let dir = unpack(tmp.path(), &tar, &diff_id(&tar)).unwrap();
        assert_eq!(std::fs::read(dir.join("b")).unwrap(), b"plain");
    }

    #[test]
    fn parent_dir_traversal_is_rejected_and_nothing_is_left() {
        let tmp = tempfile::tempdir().unwrap();
        let tar = Layer::new().file("ok", b"1", 0o644, 0).raw_file("../escape").finish();
        let err = unpack(tmp.path(), &tar, &diff_id(&tar)).unwrap_err();
        assert!(matches!(&err, ImageError::InvalidArgument(m) if m.contains("leaves the layer")), "{err:?}");
        assert!(!tmp.path().join("escape").exists());
        assert_eq!(std::fs::read_dir(tmp.path().join("layers")).unwrap().count(), 0);
    }

    #[test]
    fn writing_through_a_symlink_out_of_the_layer_is_rejected() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        let tar = Layer::new()
            .link(tar::EntryType::Symlink, "evil", outside.to_str().unwrap())
            .file("evil/pwned", b"x", 0o644, 0)
            .finish();
        let err = unpack(tmp.path(), &tar, &diff_id(&tar)).unwrap_err();
        assert!(matches!(&err, ImageError::InvalidArgument(_)), "{err:?}");
        assert!(!outside.join("pwned").exists());
        // Whiteouts under such a symlink are refused as well.
        let tar = Layer::new()
            .link(tar::EntryType::Symlink, "evil", outside.to_str().unwrap())
            .file("evil/.wh.x", b"", 0o644, 0)
            .finish();
        assert!(unpack(tmp.path(), &tar, &diff_id(&tar)).is_err());
        assert!(!outside.join("x").exists());
        // And hard links to files outside.
        let tar = Layer::new().link(tar::EntryType::Link, "h", "../../etc/passwd").finish();
        assert!(matches!(unpack(tmp.path(), &tar, &diff_id(&tar)), Err(ImageError::InvalidArgument(_))));
    }

    #[test]
    fn wrong_diff_id_discards_the_unpacked_layer() {
        let tmp = tempfile::tempdir().unwrap();
        let tar = Layer::new().file("a", b"1", 0o644, 0).finish();
        let wrong = diff_id(b"something else");
        assert!(matches!(unpack(tmp.path(), &tar, &wrong), Err(ImageError::DigestMismatch { .. })));
        assert_eq!(std::fs::read_dir(tmp.path().join("layers")).unwrap().count(), 0);
    }

    #[test]
    fn device_nodes_are_created() {
        let tmp = tempfile::tempdir().unwrap();
        let mut layer = Layer::new();
        let mut h = Layer::header(tar::EntryType::Char, 0o666, 0);
        h.set_device_major(1).unwrap();
        h.set_device_minor(3).unwrap();
        layer.builder.append_data(&mut h, "dev/null", std::io::empty()).unwrap();
        let tar = layer.finish();
        let dir = unpack(tmp.path(), &tar, &diff_id(&tar)).unwrap();
        let meta = std::fs::symlink_metadata(dir.join("dev/null")).unwrap();
        assert!(meta.file_type().is_char_device());
        assert_eq!(meta.rdev(), nix::sys::stat::makedev(1, 3));
        assert_eq!(meta.permissions().mode() & 0o7777, 0o666);
        assert_eq!(meta.mtime(), 1_600_000_000);
    }

    #[test]
    fn chain_ids_follow_the_oci_definition() {
        let a = format!("sha256:{}", "a".repeat(64));
        let b = format!("sha256:{}", "b".repeat(64));
        let chain = chain_ids(&[a.clone(), b.clone()]);
        assert_eq!(chain[0], a);
        assert_eq!(chain[1], format!("sha256:{}", hex::encode(Sha256::digest(format!("{a} {b}").as_bytes()))));
    }
}
