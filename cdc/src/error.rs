//! Why a change event could not be decoded: each [`DecodeError`] becomes a dead letter
//! whose reason is [`DecodeError::reason`].

/// Why a record could not be decoded. Each becomes a dead letter.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DecodeError {
    /// The record value is not JSON (binary garbage, truncated text).
    #[error("record value is not valid JSON: {0}")]
    NotJson(String),
    /// A required field is absent or null.
    #[error("required field `{0}` is missing")]
    Missing(&'static str),
    /// A field has the wrong type or an impossible value.
    #[error("field `{field}`: {problem}")]
    Invalid {
        /// Dotted path of the field.
        field: &'static str,
        /// What is wrong with it.
        problem: String,
    },
}

impl DecodeError {
    /// Short stable reason for counters and dead letters, e.g. `not_json`,
    /// `missing_field:company`, `invalid_field:value`.
    pub fn reason(&self) -> String {
        match self {
            DecodeError::NotJson(_) => "not_json".into(),
            DecodeError::Missing(f) => format!("missing_field:{f}"),
            DecodeError::Invalid { field, .. } => format!("invalid_field:{field}"),
        }
    }
}
