//! Why a query was refused, as one typed error, and its single conversion to the wire
//! ([`tonic::Status`]); the metrics' code label is the same code. Facades that answer in their
//! own protocol take the error itself (`QueryService::answer_typed`) and map it to theirs, with
//! [`QueryError::message`], the message the status would carry.

use tonic::{Code, Status};

/// Longest NOT_FOUND message, in bytes (model names are client-controlled).
const NOT_FOUND_MAX_BYTES: usize = 1000;

/// A refused or failed query.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    /// A field of the request is missing or out of range (the message names it).
    #[error("{0}")]
    InvalidArgument(String),
    /// The request names a keyspace this replica does not hold (the message names a few it does).
    #[error("{0}")]
    UnknownKeyspace(String),
    /// The replica cannot vouch for the caller's consistency token (why: a gap, a partition it
    /// does not serve yet, ...).
    #[error("{0}")]
    Unavailable(String),
    /// The consistency token was not reached within the wait.
    #[error("{0}")]
    TokenNotReached(String),
    /// A limit on concurrent streams or message sizes.
    #[error("{0}")]
    ResourceExhausted(String),
}

impl QueryError {
    /// The gRPC code it is answered with (and the metrics' `code` label).
    pub fn code(&self) -> Code {
        match self {
            Self::InvalidArgument(_) => Code::InvalidArgument,
            Self::UnknownKeyspace(_) => Code::NotFound,
            Self::Unavailable(_) => Code::Unavailable,
            Self::TokenNotReached(_) => Code::DeadlineExceeded,
            Self::ResourceExhausted(_) => Code::ResourceExhausted,
        }
    }

    pub(crate) fn invalid(msg: impl Into<String>) -> Self {
        Self::InvalidArgument(msg.into())
    }

    /// The message it is answered with (a NOT_FOUND one clipped: model names are
    /// client-controlled).
    pub fn message(&self) -> String {
        match self {
            Self::UnknownKeyspace(m) => clip(m, NOT_FOUND_MAX_BYTES),
            Self::InvalidArgument(m)
            | Self::Unavailable(m)
            | Self::TokenNotReached(m)
            | Self::ResourceExhausted(m) => m.clone(),
        }
    }
}

impl From<QueryError> for Status {
    fn from(e: QueryError) -> Self {
        Status::new(e.code(), e.message())
    }
}

/// `s`, cut to at most `max` bytes (on a character boundary) with "..." when cut.
pub fn clip(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut cut = max.saturating_sub(3);
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}...", &s[..cut])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_error_keeps_its_code_and_message_on_the_wire() {
        let cases = [
            (QueryError::invalid("top_k"), Code::InvalidArgument),
            (QueryError::UnknownKeyspace("no keyspace".into()), Code::NotFound),
            (QueryError::Unavailable("gap".into()), Code::Unavailable),
            (QueryError::TokenNotReached("late".into()), Code::DeadlineExceeded),
            (QueryError::ResourceExhausted("streams".into()), Code::ResourceExhausted),
        ];
        for (e, code) in cases {
            let msg = e.to_string();
            let s = Status::from(e);
            assert_eq!((s.code(), s.message()), (code, msg.as_str()));
        }
    }

    #[test]
    fn a_long_not_found_message_is_clipped() {
        let e = QueryError::UnknownKeyspace("x".repeat(5000));
        assert!(e.message().len() <= NOT_FOUND_MAX_BYTES && e.message().ends_with("..."));
        assert_eq!(Status::from(e.clone()).message(), e.message());
    }
}
