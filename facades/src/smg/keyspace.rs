//! SMG keyspaces `(model, symbol_kind, block_size, hash_scheme)` → prefixlog keyspaces
//! `(model, block_size, scheme id)`.
//!
//! SMG's `content_hash` is position-free (one block's symbols), prefixlog's canonical scheme 1
//! is chained, so SMG's hashes get scheme ids of their own (docs/compat/README.md, "Hash
//! schemes"): `TOKENS` under wire scheme v1 → 2, `BYTES` under v1 → 3. prefixlog files a block
//! by its path from the root, so position-free locals still only match at their position.
//! Wire scheme 0 means 1 (upstream). Anything else cannot be mapped and is refused: another
//! wire scheme would hash differently, and matching it against v1 hashes would match nothing
//! (or the wrong blocks).

use super::pb;
use prefixlog_engine::KeyspaceId;

/// prefixlog scheme id of SMG `TOKENS` keyspaces (wire scheme v1 content hashes).
pub const HASH_SCHEME_SMG_TOKENS: u32 = 2;
/// prefixlog scheme id of SMG `BYTES` keyspaces (wire scheme v1 content hashes of text).
pub const HASH_SCHEME_SMG_BYTES: u32 = 3;
/// The one SMG wire hash scheme this build serves.
pub const WIRE_SCHEME_V1: u32 = 1;

/// Why a keyspace cannot be mapped.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KeyspaceError {
    #[error("keyspace missing")]
    Missing,
    #[error("keyspace model must not be empty")]
    NoModel,
    #[error("keyspace model has {0} bytes; at most {max}", max = super::MAX_HOLDER_BYTES)]
    ModelTooLong(usize),
    #[error("keyspace block_size must not be 0")]
    NoBlockSize,
    #[error("keyspace symbol_kind {0} is not TOKENS (1) or BYTES (2)")]
    SymbolKind(i32),
    #[error("unsupported hash scheme {0}; this build serves scheme 1")]
    HashScheme(u32),
}

impl KeyspaceError {
    /// The status a `Publish` stream ends with (upstream: FAILED_PRECONDITION for a scheme).
    pub fn status(&self) -> tonic::Status {
        match self {
            Self::HashScheme(_) => tonic::Status::failed_precondition(self.to_string()),
            _ => tonic::Status::invalid_argument(self.to_string()),
        }
    }

    /// The `reason` label of a query answered empty for it.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::HashScheme(_) => "unsupported_hash_scheme",
            _ => "invalid_keyspace",
        }
    }
}

/// The prefixlog keyspace of an SMG keyspace.
pub fn map(k: Option<&pb::Keyspace>) -> Result<KeyspaceId, KeyspaceError> {
    let k = k.ok_or(KeyspaceError::Missing)?;
    if k.model.is_empty() {
        return Err(KeyspaceError::NoModel);
    }
    if k.model.len() > super::MAX_HOLDER_BYTES {
        return Err(KeyspaceError::ModelTooLong(k.model.len()));
    }
    if k.block_size == 0 {
        return Err(KeyspaceError::NoBlockSize);
    }
    if k.hash_scheme != 0 && k.hash_scheme != WIRE_SCHEME_V1 {
        return Err(KeyspaceError::HashScheme(k.hash_scheme));
    }
    let scheme = match pb::SymbolKind::try_from(k.symbol_kind) {
        Ok(pb::SymbolKind::Tokens) => HASH_SCHEME_SMG_TOKENS,
        Ok(pb::SymbolKind::Bytes) => HASH_SCHEME_SMG_BYTES,
        _ => return Err(KeyspaceError::SymbolKind(k.symbol_kind)),
    };
    Ok(KeyspaceId::new(k.model.clone(), k.block_size, scheme))
}

/// The SMG keyspace of a prefixlog keyspace this facade writes (`None`: not an SMG scheme).
pub fn unmap(id: &KeyspaceId) -> Option<pb::Keyspace> {
    let kind = match id.scheme {
        HASH_SCHEME_SMG_TOKENS => pb::SymbolKind::Tokens,
        HASH_SCHEME_SMG_BYTES => pb::SymbolKind::Bytes,
        _ => return None,
    };
    Some(pb::Keyspace {
        model: id.model.clone(),
        symbol_kind: kind as i32,
        block_size: id.block_size,
        hash_scheme: WIRE_SCHEME_V1,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ks(kind: pb::SymbolKind, block_size: u32, scheme: u32) -> pb::Keyspace {
        pb::Keyspace { model: "m".into(), symbol_kind: kind as i32, block_size, hash_scheme: scheme }
    }

    #[test]
    fn tokens_and_bytes_get_their_scheme_ids_and_map_back() {
        let t = map(Some(&ks(pb::SymbolKind::Tokens, 16, 0))).unwrap();
        assert_eq!(t, KeyspaceId::new("m", 16, HASH_SCHEME_SMG_TOKENS));
        assert_eq!(map(Some(&ks(pb::SymbolKind::Tokens, 16, 1))).unwrap(), t, "0 means 1");
        let b = map(Some(&ks(pb::SymbolKind::Bytes, 256, 1))).unwrap();
        assert_eq!(b, KeyspaceId::new("m", 256, HASH_SCHEME_SMG_BYTES));
        assert_eq!(unmap(&b), Some(ks(pb::SymbolKind::Bytes, 256, 1)));
        assert_eq!(unmap(&KeyspaceId::new("m", 16, 1)), None);
    }

    #[test]
    fn what_cannot_be_mapped_is_refused() {
        assert_eq!(map(None), Err(KeyspaceError::Missing));
        let err = map(Some(&ks(pb::SymbolKind::Tokens, 16, 2))).unwrap_err();
        assert_eq!(err, KeyspaceError::HashScheme(2));
        assert_eq!(err.status().code(), tonic::Code::FailedPrecondition);
        assert_eq!(map(Some(&ks(pb::SymbolKind::Tokens, 0, 1))), Err(KeyspaceError::NoBlockSize));
        assert_eq!(map(Some(&ks(pb::SymbolKind::Unspecified, 16, 1))), Err(KeyspaceError::SymbolKind(0)));
        let mut no_model = ks(pb::SymbolKind::Tokens, 16, 1);
        no_model.model.clear();
        assert_eq!(map(Some(&no_model)).unwrap_err().status().code(), tonic::Code::InvalidArgument);
    }
}
