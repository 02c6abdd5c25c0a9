//! Error messages that carry their causes.

/// `error: cause: cause …`: an error with all its sources on one line, for logs and for
/// messages that must stand alone (a CRI status message, a monitor's failure report), where
/// `Display` alone would drop the cause that says what actually went wrong.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot read the config")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn every_source_follows_the_error_after_a_colon() {
        let inner = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        assert_eq!(error_chain(&Outer(inner)), "cannot read the config: no such file");
    }

    #[test]
    fn an_error_without_sources_is_its_own_message() {
        assert_eq!(error_chain(&std::io::Error::other("boom")), "boom");
    }
}
