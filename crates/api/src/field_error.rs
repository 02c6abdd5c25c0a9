//! Field-level validation errors, worded and typed as Kubernetes' `field.Error`.

use std::fmt;

/// Kubernetes' `field.ErrorType`; `reason()` is the `StatusCause.reason` on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorType {
    NotFound,
    Required,
    Duplicate,
    Invalid,
    NotSupported,
    Forbidden,
    TooLong,
    TooMany,
    Internal,
}

impl ErrorType {
    pub fn reason(self) -> &'static str {
        match self {
            ErrorType::NotFound => "FieldValueNotFound",
            ErrorType::Required => "FieldValueRequired",
            ErrorType::Duplicate => "FieldValueDuplicate",
            ErrorType::Invalid => "FieldValueInvalid",
            ErrorType::NotSupported => "FieldValueNotSupported",
            ErrorType::Forbidden => "FieldValueForbidden",
            ErrorType::TooLong => "FieldValueTooLong",
            ErrorType::TooMany => "FieldValueTooMany",
            ErrorType::Internal => "InternalError",
        }
    }

    fn phrase(self) -> &'static str {
        match self {
            ErrorType::NotFound => "Not found",
            ErrorType::Required => "Required value",
            ErrorType::Duplicate => "Duplicate value",
            ErrorType::Invalid => "Invalid value",
            ErrorType::NotSupported => "Unsupported value",
            ErrorType::Forbidden => "Forbidden",
            ErrorType::TooLong => "Too long",
            ErrorType::TooMany => "Too many",
            ErrorType::Internal => "Internal error",
        }
    }
}

/// One invalid field: `spec.containers[0].name: Required value`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    pub error_type: ErrorType,
    /// Dotted path with indices, e.g. `spec.containers[0].image`.
    pub field: String,
    /// The offending value rendered as Kubernetes does (strings quoted), if it is shown.
    pub bad_value: Option<String>,
    pub detail: String,
}

impl FieldError {
    pub fn required(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self { error_type: ErrorType::Required, field: field.into(), bad_value: None, detail: detail.into() }
    }
    /// `value` is rendered as a quoted string, as Kubernetes shows string values.
    pub fn invalid(field: impl Into<String>, value: &str, detail: impl Into<String>) -> Self {
        Self {
            error_type: ErrorType::Invalid,
            field: field.into(),
            bad_value: Some(format!("{value:?}")),
            detail: detail.into(),
        }
    }
    /// `value` is shown as is (numbers, or pre-rendered values).
    pub fn invalid_raw(field: impl Into<String>, value: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            error_type: ErrorType::Invalid,
            field: field.into(),
            bad_value: Some(value.into()),
            detail: detail.into(),
        }
    }
    pub fn forbidden(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self { error_type: ErrorType::Forbidden, field: field.into(), bad_value: None, detail: detail.into() }
    }
    pub fn not_supported(field: impl Into<String>, value: &str, supported: &[&str]) -> Self {
        let list: Vec<String> = supported.iter().map(|s| format!("{s:?}")).collect();
        Self {
            error_type: ErrorType::NotSupported,
            field: field.into(),
            bad_value: Some(format!("{value:?}")),
            detail: format!("supported values: {}", list.join(", ")),
        }
    }
    pub fn duplicate(field: impl Into<String>, value: &str) -> Self {
        Self {
            error_type: ErrorType::Duplicate,
            field: field.into(),
            bad_value: Some(format!("{value:?}")),
            detail: String::new(),
        }
    }
    pub fn too_long(field: impl Into<String>, max: usize) -> Self {
        Self {
            error_type: ErrorType::TooLong,
            field: field.into(),
            bad_value: None,
            detail: format!("may not be more than {max} bytes"),
        }
    }
}

impl fmt::Display for FieldError {
    /// `field: Invalid value: "x": detail`, as Kubernetes' `field.Error.Error()`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.error_type.phrase())?;
        if let Some(v) = &self.bad_value {
            write!(f, ": {v}")?;
        }
        if !self.detail.is_empty() {
            write!(f, ": {}", self.detail)?;
        }
        Ok(())
    }
}

/// The message of a 422 Invalid status: `Pod "x" is invalid: <e1>` or `... is invalid: [<e1>, <e2>]`.
pub fn invalid_message(kind: &str, name: &str, errors: &[FieldError]) -> String {
    let parts: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
    if parts.len() == 1 {
        format!("{kind} {name:?} is invalid: {}", parts[0])
    } else {
        format!("{kind} {name:?} is invalid: [{}]", parts.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_error_is_shown_without_brackets() {
        let e = FieldError::required("spec.handler", "");
        assert_eq!(
            invalid_message("RuntimeClass", "rc", &[e]),
            "RuntimeClass \"rc\" is invalid: spec.handler: Required value"
        );
    }

    #[test]
    fn several_errors_are_bracketed_and_comma_separated() {
        let a = FieldError::invalid(
            "metadata.name",
            "A",
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-'",
        );
        let b = FieldError::required("spec.containers", "");
        let m = invalid_message("Pod", "A", &[a, b]);
        assert!(m.starts_with("Pod \"A\" is invalid: [metadata.name: Invalid value: \"A\": a lowercase"));
        assert!(m.ends_with(", spec.containers: Required value]"));
    }
}
