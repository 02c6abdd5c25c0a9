//! Bearer-token authentication: the admin token, a Kubernetes token CSV file, and the node
//! tokens `berth server token create` adds to the data dir while the server runs.
//!
//! Token files use kube-apiserver's `--token-auth-file` format: one
//! `token,user,uid[,"group1,group2"]` record per line, parsed with Go `encoding/csv` quoting
//! rules. Blank lines and lines starting with `#` are skipped. Multi-line quoted fields are
//! not supported.
//!
//! The node token file (`<data-dir>/node-tokens.csv`, mode 0600) only grows: creating a token
//! for a node that has one adds a second, and both work. Deleting a line revokes that token;
//! the server notices a changed file on the next unknown token at once and on known node
//! tokens within [`NODE_TOKENS_RECHECK`].

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Group every authenticated user belongs to, as Kubernetes adds it.
const AUTHENTICATED_GROUP: &str = "system:authenticated";
/// Users in this group may do anything.
pub const MASTERS_GROUP: &str = "system:masters";
/// Group of node agents (kubelets); with a `system:node:<node>` user name it identifies a node.
pub const NODES_GROUP: &str = "system:nodes";
/// Prefix of a node agent's user name; the node's name follows.
pub const NODE_USER_PREFIX: &str = "system:node:";
/// The node token file in the server's data dir.
pub const NODE_TOKEN_FILE: &str = "node-tokens.csv";
/// How stale the server's copy of the node token file may get while every token it sees is known.
pub const NODE_TOKENS_RECHECK: Duration = Duration::from_secs(1);

/// The identity behind a request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UserInfo {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
    /// More about the user (a pod-bound service account token's pod), by key.
    pub extra: std::collections::BTreeMap<String, Vec<String>>,
}

impl UserInfo {
    pub fn in_group(&self, group: &str) -> bool {
        self.groups.iter().any(|g| g == group)
    }
}

/// Why a token file could not be loaded or a node token not created.
#[derive(Debug, thiserror::Error)]
pub enum AuthnError {
    #[error("cannot read token file {}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("token file {} line {line}: {reason}", path.display())]
    Malformed { path: PathBuf, line: usize, reason: String },
    #[error("invalid node name {name:?}: {reason}")]
    InvalidNodeName { name: String, reason: String },
    #[error("cannot write token file {}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot generate a random token")]
    Random,
}

type Entries = Vec<(Vec<u8>, UserInfo)>;

/// Maps bearer tokens to users. The admin token always maps to the admin user.
#[derive(Clone)]
pub struct TokenAuthenticator {
    /// The admin entry comes first; file entries follow in file order, one per token.
    entries: Entries,
    /// The node token file, re-read when it changes; its tokens never override `entries`.
    node_tokens: Option<Arc<ReloadingTokenFile>>,
}

impl std::fmt::Debug for TokenAuthenticator {
    // Tokens are secrets; show only who can log in.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenAuthenticator")
            .field("users", &self.entries.iter().map(|(_, u)| &u.name).collect::<Vec<_>>())
            .finish()
    }
}

impl TokenAuthenticator {
    /// An authenticator accepting `admin_token` as user `admin` in `system:masters`.
    pub fn new(admin_token: String) -> Self {
        let admin = UserInfo {
            name: "admin".into(),
            uid: String::new(),
            groups: vec![MASTERS_GROUP.into(), AUTHENTICATED_GROUP.into()],
            ..Default::default()
        };
        Self { entries: vec![(admin_token.into_bytes(), admin)], node_tokens: None }
    }

    /// The admin token, which the server also presents to node agents (its kubelet client identity).
    pub fn admin_token(&self) -> &str {
        std::str::from_utf8(&self.entries[0].0).unwrap_or_default()
    }

    /// Adds the users of a static token CSV file (`--token-auth-file` format).
    ///
    /// As in Kubernetes, a record with fewer than 3 columns is an error, columns past the
    /// fourth are ignored, a record with an empty token is skipped with a warning, and a
    /// duplicate token replaces the earlier record with a warning. A record reusing the admin
    /// token is skipped with a warning so the file cannot change who the admin is.
    pub fn load_token_file(&mut self, path: &Path) -> Result<(), AuthnError> {
        let content =
            std::fs::read_to_string(path).map_err(|source| AuthnError::Io { path: path.to_path_buf(), source })?;
        // Parse the whole file before changing anything, so an error leaves us unchanged.
        let loaded = parse_token_file(path, &content)?;
        for (token, user) in loaded {
            if ct_eq(&token, &self.entries[0].0) {
                tracing::warn!(path = %path.display(), "skipping token file record that reuses the admin token");
                continue;
            }
            match self.entries[1..].iter_mut().find(|(t, _)| *t == token) {
                Some(existing) => existing.1 = user,
                None => self.entries.push((token, user)),
            }
        }
        Ok(())
    }

    /// Adds the tokens of `path`, a file in the same format that may appear, change or vanish
    /// while the server runs (the node token file). A missing file holds no tokens.
    pub fn watch_token_file(&mut self, path: &Path) -> Result<(), AuthnError> {
        let file = ReloadingTokenFile::load(path)?;
        self.node_tokens = Some(Arc::new(file));
        Ok(())
    }

    /// The user for an `Authorization: Bearer <token>` header value, if the token is known.
    ///
    /// The scheme is matched case-insensitively. Every known token is compared in constant
    /// time so response timing does not reveal how much of a guess was right.
    pub fn authenticate(&self, authorization_header: Option<&str>) -> Option<UserInfo> {
        self.authenticate_token(bearer_token(authorization_header?)?)
    }

    /// The user a bearer token belongs to, if it is known (what a TokenReview asks).
    pub fn authenticate_token(&self, token: &str) -> Option<UserInfo> {
        let token = token.as_bytes();
        if let Some(user) = lookup(&self.entries, token) {
            return Some(user);
        }
        let file = self.node_tokens.as_ref()?;
        if let Some(user) = lookup(&file.entries(false), token) {
            return Some(user);
        }
        // An unknown token may have been created a moment ago: look at the file now.
        lookup(&file.entries(true), token)
    }
}

fn lookup(entries: &Entries, token: &[u8]) -> Option<UserInfo> {
    let mut found = None;
    for (known, user) in entries {
        if ct_eq(known, token) && found.is_none() {
            found = Some(user);
        }
    }
    found.cloned()
}

/// What identifies one version of a file: replaced files get a new inode, edited ones a new
/// mtime or size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FileStamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl FileStamp {
    fn of(path: &Path) -> std::io::Result<Option<FileStamp>> {
        match std::fs::metadata(path) {
            Ok(m) => Ok(Some(FileStamp {
                dev: m.dev(),
                ino: m.ino(),
                len: m.len(),
                mtime: (m.mtime(), m.mtime_nsec()),
                ctime: (m.ctime(), m.ctime_nsec()),
            })),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// A token file kept in memory and re-read when its stamp changes.
struct ReloadingTokenFile {
    path: PathBuf,
    state: Mutex<Reloaded>,
}

struct Reloaded {
    entries: Arc<Entries>,
    /// The version `entries` came from (or the one that failed to parse); `None`: no file.
    stamp: Option<FileStamp>,
    checked_at: Instant,
}

impl ReloadingTokenFile {
    fn load(path: &Path) -> Result<Self, AuthnError> {
        let io = |source| AuthnError::Io { path: path.to_path_buf(), source };
        let stamp = FileStamp::of(path).map_err(io)?;
        let entries = match stamp {
            Some(_) => parse_token_file(path, &std::fs::read_to_string(path).map_err(io)?)?,
            None => Vec::new(),
        };
        let state = Reloaded { entries: Arc::new(entries), stamp, checked_at: Instant::now() };
        Ok(Self { path: path.to_path_buf(), state: Mutex::new(state) })
    }

    /// The current tokens, after looking at the file if `now` or the last look is stale. A file
    /// that cannot be read or parsed keeps the previous tokens.
    ///
    /// The look is a `stat` (and a read when the file changed): small enough to do inline.
    fn entries(&self, now: bool) -> Arc<Entries> {
        let mut state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if !now && state.checked_at.elapsed() < NODE_TOKENS_RECHECK {
            return state.entries.clone();
        }
        state.checked_at = Instant::now();
        let stamp = match FileStamp::of(&self.path) {
            Ok(stamp) => stamp,
            Err(error) => {
                tracing::warn!(path = %self.path.display(), %error, "cannot check the node token file");
                return state.entries.clone();
            }
        };
        if stamp == state.stamp {
            return state.entries.clone();
        }
        state.stamp = stamp;
        let parsed = match stamp {
            None => Ok(Vec::new()),
            Some(_) => std::fs::read_to_string(&self.path)
                .map_err(|source| AuthnError::Io { path: self.path.clone(), source })
                .and_then(|content| parse_token_file(&self.path, &content)),
        };
        match parsed {
            Ok(entries) => {
                tracing::info!(path = %self.path.display(), tokens = entries.len(), "loaded node tokens");
                state.entries = Arc::new(entries);
            }
            Err(error) => {
                tracing::warn!(error = %error, "keeping the previous node tokens");
            }
        }
        state.entries.clone()
    }
}

/// The records of a token file, validated whole; a later duplicate token replaces an earlier one.
///
/// As in Kubernetes, a record with fewer than 3 columns is an error, columns past the fourth
/// are ignored and a record with an empty token is skipped with a warning.
fn parse_token_file(path: &Path, content: &str) -> Result<Entries, AuthnError> {
    let malformed = |line: usize, reason: String| AuthnError::Malformed { path: path.to_path_buf(), line, reason };
    let mut loaded: Entries = Vec::new();
    for (index, raw) in content.lines().enumerate() {
        let line = index + 1;
        let text = raw.strip_suffix('\r').unwrap_or(raw);
        if text.trim().is_empty() || text.starts_with('#') {
            continue;
        }
        let record = parse_csv_line(text).map_err(|reason| malformed(line, reason.into()))?;
        if record.len() < 3 {
            return Err(malformed(
                line,
                format!("must have at least 3 columns (token, user name, user uid), found {}", record.len()),
            ));
        }
        let mut record = record.into_iter();
        let (token, name, uid) =
            (record.next().unwrap_or_default(), record.next().unwrap_or_default(), record.next().unwrap_or_default());
        if token.is_empty() {
            tracing::warn!(path = %path.display(), line, "skipping empty token in token file");
            continue;
        }
        let mut groups: Vec<String> = record
            .next()
            .map(|g| g.split(',').filter(|g| !g.is_empty()).map(String::from).collect())
            .unwrap_or_default();
        if !groups.iter().any(|g| g == AUTHENTICATED_GROUP) {
            groups.push(AUTHENTICATED_GROUP.into());
        }
        let user = UserInfo { name, uid, groups, ..Default::default() };
        let token = token.into_bytes();
        match loaded.iter_mut().find(|(t, _)| *t == token) {
            Some(existing) => {
                tracing::warn!(path = %path.display(), line, "duplicate token in token file; the later record wins");
                existing.1 = user;
            }
            None => loaded.push((token, user)),
        }
    }
    Ok(loaded)
}

/// A node's name must be a DNS-1123 subdomain, as a Node object's name.
pub fn validate_node_name(node: &str) -> Result<(), AuthnError> {
    let problems = berth_api::validation::is_dns1123_subdomain(node);
    if !problems.is_empty() {
        return Err(AuthnError::InvalidNodeName { name: node.to_string(), reason: problems.join("; ") });
    }
    Ok(())
}

/// Creates a random bearer token for node `node` (user `system:node:<node>`, group
/// `system:nodes`) and adds it to `<data_dir>/node-tokens.csv`; earlier tokens stay valid.
///
/// The file is replaced atomically (a running server never reads half of it) under an
/// exclusive lock on the data dir, so concurrent calls do not lose each other's tokens.
pub fn create_node_token(data_dir: &Path, node: &str) -> Result<String, AuthnError> {
    validate_node_name(node)?;
    let path = data_dir.join(NODE_TOKEN_FILE);
    let write_err = |source| AuthnError::Write { path: path.clone(), source };
    let dir = std::fs::File::open(data_dir).map_err(write_err)?;
    let _lock = nix::fcntl::Flock::lock(dir, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, errno)| write_err(std::io::Error::from(errno)))?;
    let mut content = match std::fs::read_to_string(&path) {
        Ok(content) => content,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(source) => return Err(AuthnError::Io { path: path.clone(), source }),
    };
    // Refuse to add to a file the server cannot load: the new token would not work either.
    parse_token_file(&path, &content)?;
    let token = random_token()?;
    if !content.is_empty() && !content.ends_with('\n') {
        content.push('\n');
    }
    let user = format!("{NODE_USER_PREFIX}{node}");
    content.push_str(&csv_record(&[&token, &user, "", NODES_GROUP]));
    content.push('\n');
    berth_common::fs::write_atomic(&path, content.as_bytes(), 0o600).map_err(|e| write_err(e.source))?;
    // The rename survives a host crash only once the directory is synced.
    std::fs::File::open(data_dir).and_then(|dir| dir.sync_all()).map_err(write_err)?;
    Ok(token)
}

/// 32 random bytes as hex, like the admin token.
fn random_token() -> Result<String, AuthnError> {
    let mut bytes = [0u8; 32];
    rustls::crypto::ring::default_provider().secure_random.fill(&mut bytes).map_err(|_| AuthnError::Random)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// One CSV record, quoting fields as Go's `encoding/csv` writer does.
fn csv_record(fields: &[&str]) -> String {
    let quoted: Vec<String> = fields
        .iter()
        .map(|f| {
            if f.contains([',', '"', '\r', '\n']) || f.starts_with(' ') {
                format!("\"{}\"", f.replace('"', "\"\""))
            } else {
                f.to_string()
            }
        })
        .collect();
    quoted.join(",")
}

/// The token of a `Bearer` header, split like kube-apiserver does: the scheme and the token
/// are separated by a single space and anything after a further space is ignored.
/// The token of an `Authorization: Bearer <token>` header value.
pub fn bearer_token(header: &str) -> Option<&str> {
    let (scheme, rest) = header.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let token = rest.split(' ').next().unwrap_or_default();
    (!token.is_empty()).then_some(token)
}

/// Compares without an early exit; only the length is allowed to leak.
fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// Splits one CSV line into fields with Go `encoding/csv` rules (quotes only around whole
/// fields, `""` for a literal quote, no trimming).
fn parse_csv_line(line: &str) -> Result<Vec<String>, &'static str> {
    let mut fields = Vec::new();
    let mut chars = line.chars().peekable();
    loop {
        let mut field = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            loop {
                match chars.next() {
                    Some('"') if chars.peek() == Some(&'"') => {
                        chars.next();
                        field.push('"');
                    }
                    Some('"') => break,
                    Some(c) => field.push(c),
                    None => return Err("unterminated quoted field"),
                }
            }
            match chars.next() {
                None => {
                    fields.push(field);
                    return Ok(fields);
                }
                Some(',') => fields.push(field),
                Some(_) => return Err("extraneous or missing \" in quoted field"),
            }
        } else {
            loop {
                match chars.next() {
                    None => {
                        fields.push(field);
                        return Ok(fields);
                    }
                    Some(',') => break,
                    Some('"') => return Err("bare \" in non-quoted field"),
                    Some(c) => field.push(c),
                }
            }
            fields.push(field);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_file(content: &str) -> Result<TokenAuthenticator, AuthnError> {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), content).unwrap();
        let mut authn = TokenAuthenticator::new("admintoken".into());
        authn.load_token_file(file.path())?;
        Ok(authn)
    }

    fn bearer(token: &str) -> String {
        format!("Bearer {token}")
    }

    #[test]
    fn the_admin_token_authenticates_as_admin_in_system_masters() {
        let authn = TokenAuthenticator::new("s3cret".into());
        let user = authn.authenticate(Some("Bearer s3cret")).unwrap();
        assert_eq!(user.name, "admin");
        assert_eq!(user.groups, ["system:masters", "system:authenticated"]);
    }

    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        let authn = TokenAuthenticator::new("s3cret".into());
        assert!(authn.authenticate(Some("bearer s3cret")).is_some());
        assert!(authn.authenticate(Some("BEARER s3cret")).is_some());
    }

    #[test]
    fn a_missing_header_wrong_token_or_other_scheme_is_rejected() {
        let authn = TokenAuthenticator::new("s3cret".into());
        assert_eq!(authn.authenticate(None), None);
        assert_eq!(authn.authenticate(Some("Bearer s3cre")), None);
        assert_eq!(authn.authenticate(Some("Bearer s3cret2")), None);
        assert_eq!(authn.authenticate(Some("Bearer ")), None);
        assert_eq!(authn.authenticate(Some("Bearer")), None);
        assert_eq!(authn.authenticate(Some("Basic s3cret")), None);
        assert_eq!(authn.authenticate(Some("s3cret")), None);
        // kube-apiserver splits on single spaces, so a doubled space leaves an empty token.
        assert_eq!(authn.authenticate(Some("Bearer  s3cret")), None);
    }

    #[test]
    fn three_and_four_column_records_load_with_quoted_groups() {
        let authn = with_file(
            "# comment line\n\
             \n\
             tok1,alice,uid-1\n\
             tok2,bob,uid-2,\"dev,ops\"\n\
             tok3,carol,uid-3,viewers\r\n\
             tok4,dave,uid-4,\"system:authenticated\",ignored\n",
        )
        .unwrap();
        let alice = authn.authenticate(Some(&bearer("tok1"))).unwrap();
        assert_eq!(
            alice,
            UserInfo {
                name: "alice".into(),
                uid: "uid-1".into(),
                groups: vec!["system:authenticated".into()],
                ..Default::default()
            }
        );
        let bob = authn.authenticate(Some(&bearer("tok2"))).unwrap();
        assert_eq!(bob.name, "bob");
        assert_eq!(bob.uid, "uid-2");
        assert_eq!(bob.groups, ["dev", "ops", "system:authenticated"]);
        let carol = authn.authenticate(Some(&bearer("tok3"))).unwrap();
        assert_eq!(carol.groups, ["viewers", "system:authenticated"]);
        let dave = authn.authenticate(Some(&bearer("tok4"))).unwrap();
        assert_eq!(dave.groups, ["system:authenticated"]);
        assert_eq!(authn.authenticate(Some(&bearer("admintoken"))).unwrap().name, "admin");
        assert_eq!(authn.authenticate(Some(&bearer("tok5"))), None);
    }

    #[test]
    fn quoted_fields_may_contain_commas_and_doubled_quotes() {
        assert_eq!(parse_csv_line(r#""a,b","say ""hi""",,c"#).unwrap(), ["a,b", r#"say "hi""#, "", "c"]);
        assert_eq!(parse_csv_line("a,").unwrap(), ["a", ""]);
    }

    #[test]
    fn a_record_with_too_few_columns_is_an_error_naming_file_and_line() {
        let err = with_file("tok1,alice,uid-1\n\n# c\ntok2,bob\n").unwrap_err();
        let AuthnError::Malformed { line, .. } = &err else {
            panic!("unexpected error {err:?}");
        };
        assert_eq!(*line, 4);
        let message = err.to_string();
        assert!(message.starts_with("token file /"), "{message}");
        assert!(
            message.ends_with("line 4: must have at least 3 columns (token, user name, user uid), found 2"),
            "{message}"
        );
    }

    #[test]
    fn bad_quoting_is_an_error_with_the_line_number() {
        for (content, reason) in [
            ("tok,al\"ice,uid\n", "bare \" in non-quoted field"),
            ("tok,\"alice\"x,uid\n", "extraneous or missing \" in quoted field"),
            ("ok,a,b\ntok,alice,uid,\"dev\n", "unterminated quoted field"),
        ] {
            let err = with_file(content).unwrap_err();
            assert!(err.to_string().ends_with(reason), "{err}");
            let AuthnError::Malformed { line, .. } = err else {
                panic!("not malformed");
            };
            assert_eq!(line, content.lines().count());
        }
    }

    #[test]
    fn a_failed_load_leaves_the_authenticator_unchanged() {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), "tok1,alice,uid-1\nbroken\n").unwrap();
        let mut authn = TokenAuthenticator::new("admintoken".into());
        assert!(authn.load_token_file(file.path()).is_err());
        assert_eq!(authn.authenticate(Some("Bearer tok1")), None);
    }

    #[test]
    fn a_duplicate_token_is_won_by_the_later_record() {
        let authn = with_file("tok,first,1\ntok,second,2,g\n").unwrap();
        let user = authn.authenticate(Some("Bearer tok")).unwrap();
        assert_eq!(user.name, "second");
        assert_eq!(user.groups, ["g", "system:authenticated"]);
    }

    #[test]
    fn empty_tokens_and_the_admin_token_in_the_file_are_skipped() {
        let authn = with_file(",nobody,0\nadmintoken,mallory,6\ntok,alice,1\n").unwrap();
        assert_eq!(authn.authenticate(Some("Bearer admintoken")).unwrap().name, "admin");
        assert_eq!(authn.authenticate(Some("Bearer tok")).unwrap().name, "alice");
    }

    #[test]
    fn a_missing_token_file_is_an_io_error() {
        let mut authn = TokenAuthenticator::new("a".into());
        let err = authn.load_token_file(Path::new("/nonexistent/tokens.csv")).unwrap_err();
        assert!(matches!(err, AuthnError::Io { .. }));
        assert_eq!(err.to_string(), "cannot read token file /nonexistent/tokens.csv");
    }

    #[test]
    fn debug_output_does_not_reveal_tokens() {
        let authn = with_file("supersecret,alice,1\n").unwrap();
        let debug = format!("{authn:?}");
        assert!(!debug.contains("supersecret") && !debug.contains("admintoken"));
        assert!(debug.contains("alice"));
    }

    #[test]
    fn a_node_token_created_while_serving_authenticates_without_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let mut authn = TokenAuthenticator::new("admintoken".into());
        authn.watch_token_file(&dir.path().join(NODE_TOKEN_FILE)).unwrap();
        let first = create_node_token(dir.path(), "node-a").unwrap();
        let user = authn.authenticate(Some(&bearer(&first))).unwrap();
        assert_eq!(
            user,
            UserInfo {
                name: "system:node:node-a".into(),
                uid: String::new(),
                groups: vec!["system:nodes".into(), "system:authenticated".into()],
                ..Default::default()
            }
        );
        let second = create_node_token(dir.path(), "node-a").unwrap();
        assert_ne!(first, second);
        assert_eq!(authn.authenticate(Some(&bearer(&second))).unwrap().name, "system:node:node-a");
        assert_eq!(authn.authenticate(Some(&bearer(&first))).unwrap().name, "system:node:node-a");
    }

    #[test]
    fn node_tokens_are_random_hex_in_a_private_file() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let token = create_node_token(dir.path(), "n1.example.com").unwrap();
        assert_eq!(token.len(), 64);
        assert!(token.chars().all(|c| c.is_ascii_hexdigit()));
        let path = dir.path().join(NODE_TOKEN_FILE);
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            format!("{token},system:node:n1.example.com,,system:nodes\n")
        );
        let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(leftovers, [std::ffi::OsString::from(NODE_TOKEN_FILE)]);
    }

    #[test]
    fn a_node_name_that_is_not_a_dns_subdomain_gets_no_token() {
        let dir = tempfile::tempdir().unwrap();
        let err = create_node_token(dir.path(), "Node_A").unwrap_err();
        assert!(err.to_string().starts_with("invalid node name \"Node_A\": a lowercase RFC 1123 subdomain"), "{err}");
        assert!(!dir.path().join(NODE_TOKEN_FILE).exists());
    }

    #[test]
    fn concurrent_token_creation_loses_no_token() {
        let dir = tempfile::tempdir().unwrap();
        let data_dir = dir.path();
        let tokens: Vec<String> = std::thread::scope(|s| {
            let handles: Vec<_> =
                (0..8).map(|i| s.spawn(move || create_node_token(data_dir, &format!("n{i}")).unwrap())).collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut authn = TokenAuthenticator::new("admintoken".into());
        authn.watch_token_file(&dir.path().join(NODE_TOKEN_FILE)).unwrap();
        for token in tokens {
            assert!(authn.authenticate(Some(&bearer(&token))).is_some());
        }
    }

    #[test]
    fn a_removed_node_token_stops_working_and_a_broken_file_keeps_the_last_tokens() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(NODE_TOKEN_FILE);
        std::fs::write(&path, "tok-a,system:node:a,,system:nodes\ntok-b,system:node:b,,system:nodes\n").unwrap();
        let mut authn = TokenAuthenticator::new("admintoken".into());
        authn.watch_token_file(&path).unwrap();
        assert!(authn.authenticate(Some("Bearer tok-a")).is_some());
        std::fs::write(&path, "tok-b,system:node:b,,system:nodes\n").unwrap();
        // A known token sees the change once the recheck interval has passed.
        std::thread::sleep(NODE_TOKENS_RECHECK + Duration::from_millis(50));
        assert_eq!(authn.authenticate(Some("Bearer tok-a")), None);
        std::fs::write(&path, "tok-b,broken\n").unwrap();
        assert_eq!(authn.authenticate(Some("Bearer nope")), None);
        assert_eq!(authn.authenticate(Some("Bearer tok-b")).unwrap().name, "system:node:b");
    }

    #[test]
    fn a_node_token_file_cannot_take_over_the_admin_token() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(NODE_TOKEN_FILE);
        std::fs::write(&path, "admintoken,system:node:a,,system:nodes\n").unwrap();
        let mut authn = TokenAuthenticator::new("admintoken".into());
        authn.watch_token_file(&path).unwrap();
        assert_eq!(authn.authenticate(Some("Bearer admintoken")).unwrap().name, "admin");
    }

    #[test]
    fn csv_fields_with_commas_or_quotes_are_quoted() {
        assert_eq!(csv_record(&["t", "u", "", "a,b"]), r#"t,u,,"a,b""#);
        assert_eq!(csv_record(&["say \"hi\""]), r#""say ""hi""""#);
        assert_eq!(parse_csv_line(&csv_record(&["x", "a,\"b\""])).unwrap(), ["x", "a,\"b\""]);
    }
}
