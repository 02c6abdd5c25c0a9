//! Bearer-token authentication: the admin token and a Kubernetes token CSV file.
//!
//! The token file uses kube-apiserver's `--token-auth-file` format: one
//! `token,user,uid[,"group1,group2"]` record per line, parsed with Go `encoding/csv` quoting
//! rules. Blank lines and lines starting with `#` are skipped. Multi-line quoted fields are
//! not supported.

use std::path::{Path, PathBuf};

/// Group every authenticated user belongs to, as Kubernetes adds it.
const AUTHENTICATED_GROUP: &str = "system:authenticated";

/// The identity behind a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserInfo {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
}

/// Why a token file could not be loaded.
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
}

/// Maps bearer tokens to users. The admin token always maps to the admin user.
#[derive(Clone)]
pub struct TokenAuthenticator {
    /// The admin entry comes first; file entries follow in file order, one per token.
    entries: Vec<(Vec<u8>, UserInfo)>,
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
            groups: vec!["system:masters".into(), AUTHENTICATED_GROUP.into()],
        };
        Self { entries: vec![(admin_token.into_bytes(), admin)] }
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
        let malformed = |line: usize, reason: String| AuthnError::Malformed { path: path.to_path_buf(), line, reason };
        // Validate the whole file before changing anything, so an error leaves us unchanged.
        let mut loaded: Vec<(Vec<u8>, UserInfo)> = Vec::new();
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
            let (token, name, uid) = (
                record.next().unwrap_or_default(),
                record.next().unwrap_or_default(),
                record.next().unwrap_or_default(),
            );
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
            let user = UserInfo { name, uid, groups };
            let token = token.into_bytes();
            if ct_eq(&token, &self.entries[0].0) {
                tracing::warn!(path = %path.display(), line, "skipping token file record that reuses the admin token");
                continue;
            }
            match loaded.iter_mut().find(|(t, _)| *t == token) {
                Some(existing) => {
                    tracing::warn!(path = %path.display(), line, "duplicate token in token file; the later record wins");
                    existing.1 = user;
                }
                None => loaded.push((token, user)),
            }
        }
        for (token, user) in loaded {
            match self.entries[1..].iter_mut().find(|(t, _)| *t == token) {
                Some(existing) => existing.1 = user,
                None => self.entries.push((token, user)),
            }
        }
        Ok(())
    }

    /// The user for an `Authorization: Bearer <token>` header value, if the token is known.
    ///
    /// The scheme is matched case-insensitively. Every known token is compared in constant
    /// time so response timing does not reveal how much of a guess was right.
    pub fn authenticate(&self, authorization_header: Option<&str>) -> Option<UserInfo> {
        let token = bearer_token(authorization_header?)?.as_bytes();
        let mut found = None;
        for (known, user) in &self.entries {
            if ct_eq(known, token) && found.is_none() {
                found = Some(user);
            }
        }
        found.cloned()
    }
}

/// The token of a `Bearer` header, split like kube-apiserver does: the scheme and the token
/// are separated by a single space and anything after a further space is ignored.
fn bearer_token(header: &str) -> Option<&str> {
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
            UserInfo { name: "alice".into(), uid: "uid-1".into(), groups: vec!["system:authenticated".into()] }
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
}
