//! Resolution of a container's user and groups to numeric ids from the container's own
//! `/etc/passwd` and `/etc/group`, read without following symlinks out of the rootfs.

use std::io;
use std::path::{Component, Path, PathBuf};

/// A failure to resolve the container's user.
#[derive(Debug, thiserror::Error)]
pub enum UserError {
    #[error("user {name:?} is not in the container's /etc/passwd")]
    UnknownUser { name: String },
    #[error("group {name:?} is not in the container's /etc/group")]
    UnknownGroup { name: String },
    #[error("invalid user {spec:?}: expected user[:group]")]
    Invalid { spec: String },
    #[error("could not read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Who the container's process runs as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedUser {
    pub uid: u32,
    pub gid: u32,
    /// The primary gid first, then the groups listing the user in `/etc/group`, then the CRI
    /// supplemental groups; without duplicates.
    pub additional_gids: Vec<u32>,
}

/// The user-related fields of a CRI `LinuxContainerSecurityContext`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UserConfig {
    pub run_as_user: Option<u32>,
    pub run_as_username: Option<String>,
    pub run_as_group: Option<u32>,
    pub supplemental_groups: Vec<u32>,
}

/// Resolves an image's `User` (`""`, `name`, `uid`, `name:group`, `uid:gid`, …) against the
/// rootfs: `(uid, gid, additional_gids)`.
pub fn resolve_user(rootfs: &Path, spec_user: &str) -> Result<(u32, u32, Vec<u32>), UserError> {
    let r = resolve(rootfs, &UserConfig::default(), spec_user)?;
    Ok((r.uid, r.gid, r.additional_gids))
}

/// Resolves the user the way Kubernetes asks: the CRI `run_as_user`/`run_as_username` wins over
/// the image's `User`, `run_as_group` over any group, and the CRI supplemental groups are merged
/// with the groups `/etc/group` gives the user.
pub fn resolve(rootfs: &Path, cri: &UserConfig, image_user: &str) -> Result<ResolvedUser, UserError> {
    let db = Db::read(rootfs)?;
    let (user_part, group_part) = if cri.run_as_user.is_some() || cri.run_as_username.is_some() {
        (None, None)
    } else {
        let mut parts = image_user.splitn(3, ':');
        let user = parts.next().filter(|u| !u.is_empty());
        let group = parts.next();
        if parts.next().is_some() || group == Some("") {
            return Err(UserError::Invalid { spec: image_user.to_owned() });
        }
        (user, group)
    };

    // The user: numeric ids need not exist in /etc/passwd; names must.
    let (uid, name, passwd_gid) = if let Some(uid) = cri.run_as_user {
        let entry = db.passwd.iter().find(|e| e.id == uid);
        (uid, entry.map(|e| e.name.clone()), entry.map(|e| e.gid))
    } else {
        let wanted = cri.run_as_username.as_deref().or(user_part).unwrap_or("0");
        match wanted.parse::<u32>() {
            Ok(uid) => {
                let entry = db.passwd.iter().find(|e| e.id == uid);
                (uid, entry.map(|e| e.name.clone()), entry.map(|e| e.gid))
            }
            Err(_) => {
                let entry = db
                    .passwd
                    .iter()
                    .find(|e| e.name == wanted)
                    .ok_or_else(|| UserError::UnknownUser { name: wanted.to_owned() })?;
                (entry.id, Some(entry.name.clone()), Some(entry.gid))
            }
        }
    };

    let gid = match (cri.run_as_group, group_part) {
        (Some(gid), _) => gid,
        (None, Some(group)) => match group.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => db
                .group
                .iter()
                .find(|g| g.name == group)
                .map(|g| g.id)
                .ok_or_else(|| UserError::UnknownGroup { name: group.to_owned() })?,
        },
        (None, None) => passwd_gid.unwrap_or(0),
    };

    let mut additional_gids = vec![gid];
    if let Some(name) = &name {
        additional_gids.extend(db.group.iter().filter(|g| g.members.iter().any(|m| m == name)).map(|g| g.id));
    }
    additional_gids.extend(cri.supplemental_groups.iter().copied());
    // Sorted, as Linux keeps a process's groups; gVisor keeps the order it is given, and `id -G`
    // would differ between handlers.
    additional_gids.sort_unstable();
    additional_gids.dedup();
    Ok(ResolvedUser { uid, gid, additional_gids })
}

struct PasswdEntry {
    name: String,
    id: u32,
    gid: u32,
}

struct GroupEntry {
    name: String,
    id: u32,
    members: Vec<String>,
}

struct Db {
    passwd: Vec<PasswdEntry>,
    group: Vec<GroupEntry>,
}

impl Db {
    /// Reads the rootfs's `/etc/passwd` and `/etc/group`; a missing file is an empty database.
    fn read(rootfs: &Path) -> Result<Db, UserError> {
        let passwd = read_in_root(rootfs, "/etc/passwd")?;
        let group = read_in_root(rootfs, "/etc/group")?;
        let fields = |line: &str| line.split(':').map(str::to_owned).collect::<Vec<_>>();
        let passwd = passwd
            .lines()
            .map(fields)
            .filter_map(|f| {
                Some(PasswdEntry {
                    name: f.first()?.clone(),
                    id: f.get(2)?.parse().ok()?,
                    gid: f.get(3)?.parse().ok()?,
                })
            })
            .collect();
        let group = group
            .lines()
            .map(fields)
            .filter_map(|f| {
                let members = f.get(3).map(|m| m.split(',').filter(|s| !s.is_empty()).map(str::to_owned).collect());
                Some(GroupEntry {
                    name: f.first()?.clone(),
                    id: f.get(2)?.parse().ok()?,
                    members: members.unwrap_or_default(),
                })
            })
            .collect();
        Ok(Db { passwd, group })
    }
}

/// Reads `path` as if `rootfs` were `/`: symlinks, absolute or relative, resolve inside the rootfs
/// and `..` stops at its top. A missing file reads as empty.
fn read_in_root(rootfs: &Path, path: &str) -> Result<String, UserError> {
    let read_err = |source| UserError::Read { path: rootfs.join(path.trim_start_matches('/')), source };
    let Some(host_path) = scoped_path(rootfs, Path::new(path)).map_err(read_err)? else {
        return Ok(String::new());
    };
    match std::fs::read(&host_path) {
        Ok(bytes) => Ok(String::from_utf8_lossy(&bytes).into_owned()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(String::new()),
        Err(e) => Err(read_err(e)),
    }
}

/// The host path of `path` inside `rootfs` with every symlink resolved within the rootfs, or
/// `None` when a component does not exist.
fn scoped_path(rootfs: &Path, path: &Path) -> io::Result<Option<PathBuf>> {
    let mut pending: Vec<PathBuf> = path.components().rev().map(|c| PathBuf::from(c.as_os_str())).collect();
    let mut resolved = PathBuf::new(); // relative to rootfs
    let mut hops = 0;
    while let Some(part) = pending.pop() {
        match part.components().next() {
            None | Some(Component::RootDir | Component::CurDir | Component::Prefix(_)) => continue,
            Some(Component::ParentDir) => {
                resolved.pop();
                continue;
            }
            Some(Component::Normal(_)) => {}
        }
        let candidate = resolved.join(&part);
        let meta = match std::fs::symlink_metadata(rootfs.join(&candidate)) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        if !meta.file_type().is_symlink() {
            resolved = candidate;
            continue;
        }
        hops += 1;
        if hops > 40 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "too many levels of symbolic links"));
        }
        let target = std::fs::read_link(rootfs.join(&candidate))?;
        if target.is_absolute() {
            resolved = PathBuf::new();
        }
        pending.extend(target.components().rev().map(|c| PathBuf::from(c.as_os_str())));
    }
    Ok(Some(rootfs.join(resolved)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\n\
                          daemon:x:1:1::/:/bin/false\n\
                          www:x:33:33:www:/var/www:/bin/sh\n\
                          app:x:1000:1001::/home/app:/bin/sh\n";
    const GROUP: &str = "root:x:0:\nwheel:x:10:root,app\nwww:x:33:\napp:x:1001:\nvideo:x:44:app\n";

    fn rootfs() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("etc")).unwrap();
        std::fs::write(dir.path().join("etc/passwd"), PASSWD).unwrap();
        std::fs::write(dir.path().join("etc/group"), GROUP).unwrap();
        dir
    }

    #[test]
    fn an_empty_user_is_root_with_roots_groups() {
        let r = rootfs();
        assert_eq!(resolve_user(r.path(), "").unwrap(), (0, 0, vec![0, 10]));
    }

    #[test]
    fn a_name_resolves_to_its_uid_primary_gid_and_member_groups() {
        let r = rootfs();
        assert_eq!(resolve_user(r.path(), "app").unwrap(), (1000, 1001, vec![10, 44, 1001]));
    }

    #[test]
    fn a_numeric_uid_need_not_exist_and_then_gets_gid_zero() {
        let r = rootfs();
        assert_eq!(resolve_user(r.path(), "4242").unwrap(), (4242, 0, vec![0]));
        assert_eq!(resolve_user(r.path(), "33").unwrap(), (33, 33, vec![33]));
    }

    #[test]
    fn an_explicit_group_by_name_or_number_replaces_the_primary_gid() {
        let r = rootfs();
        assert_eq!(resolve_user(r.path(), "app:www").unwrap(), (1000, 33, vec![10, 33, 44]));
        assert_eq!(resolve_user(r.path(), "1000:7").unwrap(), (1000, 7, vec![7, 10, 44]));
    }

    #[test]
    fn unknown_names_and_malformed_users_are_errors() {
        let r = rootfs();
        assert!(matches!(resolve_user(r.path(), "nobody"), Err(UserError::UnknownUser { name }) if name == "nobody"));
        assert!(
            matches!(resolve_user(r.path(), "app:staff"), Err(UserError::UnknownGroup { name }) if name == "staff")
        );
        assert!(matches!(resolve_user(r.path(), "a:b:c"), Err(UserError::Invalid { .. })));
        assert!(matches!(resolve_user(r.path(), "app:"), Err(UserError::Invalid { .. })));
    }

    #[test]
    fn cri_run_as_user_and_group_win_over_the_image_user_and_supplemental_groups_merge() {
        let r = rootfs();
        let cri = UserConfig {
            run_as_user: Some(1000),
            run_as_group: Some(5),
            supplemental_groups: vec![44, 99],
            ..Default::default()
        };
        let got = resolve(r.path(), &cri, "www:www").unwrap();
        assert_eq!(got, ResolvedUser { uid: 1000, gid: 5, additional_gids: vec![5, 10, 44, 99] });
        let by_name = UserConfig { run_as_username: Some("www".into()), ..Default::default() };
        assert_eq!(resolve(r.path(), &by_name, "app").unwrap().uid, 33);
    }

    #[test]
    fn a_rootfs_without_etc_files_resolves_numeric_users_only() {
        let r = tempfile::tempdir().unwrap();
        assert_eq!(resolve_user(r.path(), "").unwrap(), (0, 0, vec![0]));
        assert_eq!(resolve_user(r.path(), "12:34").unwrap(), (12, 34, vec![34]));
        assert!(resolve_user(r.path(), "app").is_err());
    }

    #[test]
    fn an_absolute_symlink_for_etc_passwd_resolves_inside_the_rootfs() {
        let r = rootfs();
        std::fs::create_dir_all(r.path().join("usr/lib")).unwrap();
        std::fs::rename(r.path().join("etc/passwd"), r.path().join("usr/lib/passwd")).unwrap();
        std::os::unix::fs::symlink("/usr/lib/../../../../usr/lib/passwd", r.path().join("etc/passwd")).unwrap();
        assert_eq!(resolve_user(r.path(), "www").unwrap().0, 33);
        // A link to a host file that the rootfs lacks reads as missing, not as the host's file.
        std::fs::remove_file(r.path().join("etc/group")).unwrap();
        std::os::unix::fs::symlink("/proc/self/status", r.path().join("etc/group")).unwrap();
        assert_eq!(resolve_user(r.path(), "www").unwrap(), (33, 33, vec![33]));
    }
}
