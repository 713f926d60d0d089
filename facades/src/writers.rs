//! Writer identity on the write surfaces (SMG `Publish`, SGLang's `ApplyExternalKvBatch` and
//! `ConfigureExpectedWorkers`): which holder / worker names a client may write, the largest
//! epoch step one update may take, and which names are written at all.
//!
//! Identity is a bearer token (`authorization: Bearer <token>` in the call's metadata) or, with
//! mutual TLS, a subject alternative name (DNS or URI) of the client's certificate, looked up in
//! a writer file (`prefixlog serve --writer-tokens FILE`), one writer a line:
//!
//! ```text
//! # token or san:NAME     names it may write (exact, `prefix*`, or `*` for every name)
//! 4f0c…9a                 gw-a  bridge-a-*
//! san:gw-b.example.org    gw-b
//! san:spiffe://example.org/bridge-c  bridge-c-*
//! ```
//!
//! A call with a token is the token's writer (its certificate is not looked at); one without is
//! the writer of the first of its certificate's names with a `san:` line.
//!
//! Without a writer file the facade is [`WriterPolicy::Open`] (every client may write every
//! name: the binary allows it only with `--allow-unauthenticated-writes`) or, behind mutual TLS,
//! [`WriterPolicy::Bound`] with no entry: every write is PERMISSION_DENIED.

use parking_lot::Mutex;
use prefixlog_engine::KeyspaceId;
use rustls_pki_types::CertificateDer;
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tonic::metadata::MetadataMap;
use tonic::{Request, Status};

/// The prefix of a writer file's certificate-name entries.
pub const SAN_PREFIX: &str = "san:";

/// The default of `serve --max-epoch-step`: the largest epoch increase one update may make, so
/// no single update moves a holder to an epoch nobody can supersede (2^64 - 1).
pub const DEFAULT_MAX_EPOCH_STEP: u64 = 1 << 32;

/// One name pattern of a token file line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NamePattern {
    /// `*`: every name.
    Any,
    /// `prefix*`: names starting with the prefix.
    Prefix(String),
    /// A name exactly.
    Exact(String),
}

impl NamePattern {
    fn parse(s: &str) -> Self {
        match s.strip_suffix('*') {
            Some("") => Self::Any,
            Some(prefix) => Self::Prefix(prefix.to_string()),
            None => Self::Exact(s.to_string()),
        }
    }

    pub fn matches(&self, name: &str) -> bool {
        match self {
            Self::Any => true,
            Self::Prefix(p) => name.starts_with(p.as_str()),
            Self::Exact(n) => n == name,
        }
    }
}

/// Most holders / workers and keyspaces one token's writer may have written in this facade
/// process (`serve --writer-max-holders`, `--writer-max-keyspaces`): below the log's shared
/// per-partition limits, one writer cannot fill them for the others.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriterQuota {
    pub holders: usize,
    pub keyspaces: usize,
}

impl Default for WriterQuota {
    fn default() -> Self {
        Self { holders: 1_024, keyspaces: 16 }
    }
}

/// What one token's writer has written (its quota's use).
#[derive(Debug, Default)]
struct Usage {
    holders: HashSet<u64>,
    keyspaces: HashSet<KeyspaceId>,
}

/// One writer of the file (a token or a `san:` line): its names and its use of its quota.
#[derive(Debug)]
pub struct TokenWriter {
    /// How metrics name it: the `san:NAME` of a certificate line, or a token line's first name
    /// pattern (never the token).
    label: String,
    /// Its line in the file: a recorded name two writers may write is counted to the first.
    line: usize,
    names: Box<[NamePattern]>,
    usage: Mutex<Usage>,
}

/// What one client may write.
#[derive(Clone, Debug)]
pub enum Grant {
    /// No token file: every name, no quota.
    Anyone,
    /// The names and quota of the client's token.
    Token(Arc<TokenWriter>, WriterQuota),
}

impl Grant {
    /// How metrics name the writer (`anyone` without a writer file).
    pub fn label(&self) -> &str {
        match self {
            Self::Anyone => "anyone",
            Self::Token(t, _) => &t.label,
        }
    }

    pub fn allows(&self, name: &str) -> bool {
        match self {
            Self::Anyone => true,
            Self::Token(t, _) => t.names.iter().any(|p| p.matches(name)),
        }
    }

    /// Takes `holder` (a worker id) and `keyspace` into the writer's quota, unless one of them
    /// is new and the quota is full: then RESOURCE_EXHAUSTED, nothing taken.
    pub fn admit(&self, holder: u64, keyspace: &KeyspaceId) -> Result<(), WriterDenied> {
        let Self::Token(t, quota) = self else { return Ok(()) };
        let mut u = t.usage.lock();
        let new_holder = !u.holders.contains(&holder);
        let new_keyspace = !u.keyspaces.contains(keyspace);
        if new_holder && u.holders.len() >= quota.holders {
            return Err(WriterDenied::HolderQuota(quota.holders));
        }
        if new_keyspace && u.keyspaces.len() >= quota.keyspaces {
            return Err(WriterDenied::KeyspaceQuota(quota.keyspaces));
        }
        u.holders.insert(holder);
        u.keyspaces.insert(keyspace.clone());
        Ok(())
    }

    /// Gives a removed holder's place in the quota back.
    pub fn release(&self, holder: u64) {
        if let Self::Token(t, _) = self {
            t.usage.lock().holders.remove(&holder);
        }
    }

    /// Refuses `name` with PERMISSION_DENIED when the client may not write it.
    pub fn check(&self, name: &str) -> Result<(), WriterDenied> {
        if self.allows(name) {
            Ok(())
        } else {
            Err(WriterDenied::NotYours(name.to_string()))
        }
    }
}

/// Why a write was refused for who sent it.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WriterDenied {
    #[error("writes need a writer token (`authorization: Bearer <token>`); none was sent")]
    NoToken,
    #[error("the writer token sent is not in this replica's --writer-tokens file")]
    UnknownToken,
    #[error(
        "no writer is bound to this client certificate's names {0:?} (a `san:NAME` line of \
         --writer-tokens), and it sent no token"
    )]
    UnboundCertificate(Vec<String>),
    #[error("this writer may not write {0:?} (not among its token's names)")]
    NotYours(String),
    #[error(
        "this writer already writes {0} holders (its quota, --writer-max-holders); a new one is refused"
    )]
    HolderQuota(usize),
    #[error(
        "this writer already writes {0} keyspaces (its quota, --writer-max-keyspaces); a new one is refused"
    )]
    KeyspaceQuota(usize),
}

impl WriterDenied {
    /// Whether the refusal is one writer's to be counted by writer (a known writer refused a
    /// name or a place), not an unknown client's.
    pub fn is_writers(&self) -> bool {
        matches!(self, Self::NotYours(_) | Self::HolderQuota(_) | Self::KeyspaceQuota(_))
    }

    /// The `reason` label it is counted under.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NoToken => "writer_no_token",
            Self::UnknownToken => "writer_unknown_token",
            Self::UnboundCertificate(_) => "writer_unbound_certificate",
            Self::NotYours(_) => "writer_not_allowed",
            Self::HolderQuota(_) => "writer_quota_holders",
            Self::KeyspaceQuota(_) => "writer_quota_keyspaces",
        }
    }

    pub fn status(&self) -> Status {
        match self {
            Self::NoToken | Self::UnknownToken => Status::unauthenticated(self.to_string()),
            Self::NotYours(_) | Self::UnboundCertificate(_) => Status::permission_denied(self.to_string()),
            Self::HolderQuota(_) | Self::KeyspaceQuota(_) => Status::resource_exhausted(self.to_string()),
        }
    }
}

/// Why a token file was not loaded.
#[derive(Debug, thiserror::Error)]
pub enum TokenFileError {
    #[error("reading writer tokens {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("writer tokens line {line}: a token needs at least one name pattern")]
    NoNames { line: usize },
    #[error("writer tokens line {line}: the token is listed twice")]
    Duplicate { line: usize },
    #[error("writer tokens: no token in the file")]
    Empty,
}

/// Why the write facades did not start (`prefixlog serve`).
#[derive(Debug, thiserror::Error)]
pub enum WriteSurfaceError {
    #[error(
        "{facades} accept log writes on a query port without client authentication: any client \
         could erase or overwrite any holder. Give --writer-tokens FILE or --tls-client-ca, or \
         --allow-unauthenticated-writes to start anyway"
    )]
    Unauthenticated { facades: String },
    #[error(transparent)]
    Tokens(#[from] TokenFileError),
}

/// Who may write: every client, or the writers of a writer file (keyed by token, or by
/// `san:NAME` for a certificate name).
#[derive(Clone, Debug, Default)]
pub enum WriterPolicy {
    #[default]
    Open,
    /// The writers by key; whether their quota use was seeded from the replica's state
    /// ([`Self::seed`]).
    Bound(Arc<HashMap<String, Arc<TokenWriter>>>, WriterQuota, Arc<AtomicBool>),
}

impl WriterPolicy {
    /// Reads a token file (format in the module docs).
    pub fn load(path: &Path) -> Result<Self, TokenFileError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| TokenFileError::Read { path: path.display().to_string(), source })?;
        Self::parse(&text)
    }

    pub fn parse(text: &str) -> Result<Self, TokenFileError> {
        let mut tokens = HashMap::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            let mut words = line.split_whitespace();
            let Some(token) = words.next() else { continue };
            let patterns: Vec<&str> = words.collect();
            let Some(first) = patterns.first() else { return Err(TokenFileError::NoNames { line: i + 1 }) };
            let label = if token.starts_with(SAN_PREFIX) { token.to_string() } else { first.to_string() };
            let names = patterns.iter().map(|p| NamePattern::parse(p)).collect();
            let writer = Arc::new(TokenWriter { label, line: i + 1, names, usage: Mutex::default() });
            if tokens.insert(token.to_string(), writer).is_some() {
                return Err(TokenFileError::Duplicate { line: i + 1 });
            }
        }
        if tokens.is_empty() {
            return Err(TokenFileError::Empty);
        }
        Ok(Self::Bound(Arc::new(tokens), WriterQuota::default(), Arc::default()))
    }

    /// The policy with each token's writer held to `quota` (no effect when open).
    pub fn with_quota(self, quota: WriterQuota) -> Self {
        match self {
            Self::Bound(t, _, seeded) => Self::Bound(t, quota, seeded),
            open => open,
        }
    }

    /// Whether the writers' quota use is still to be seeded from the replica's state.
    pub fn needs_seed(&self) -> bool {
        matches!(self, Self::Bound(_, _, seeded) if !seeded.load(Ordering::Acquire))
    }

    /// Counts `recorded` holders / workers (id, name, keyspaces it holds or feeds), as the
    /// replica applied them, into the quota use of the writer whose patterns allow the name
    /// (the first such line of the file), so a facade restart does not reset the quotas; a
    /// name no writer may write is counted to none. Idempotent (use is a set); marks the
    /// policy seeded.
    pub fn seed(&self, recorded: &[(u64, String, Vec<KeyspaceId>)]) {
        let Self::Bound(writers, _, seeded) = self else { return };
        let mut by_line: Vec<&Arc<TokenWriter>> = writers.values().collect();
        by_line.sort_by_key(|w| w.line);
        for (worker, name, keyspaces) in recorded {
            let Some(w) = by_line.iter().find(|w| w.names.iter().any(|p| p.matches(name))) else { continue };
            let mut u = w.usage.lock();
            u.holders.insert(*worker);
            u.keyspaces.extend(keyspaces.iter().cloned());
        }
        seeded.store(true, Ordering::Release);
    }

    /// Mutual TLS without a writer file: no certificate is bound to any name, so every write
    /// is refused (PERMISSION_DENIED) until a writer file binds them.
    pub fn nobody() -> Self {
        Self::Bound(Arc::default(), WriterQuota::default(), Arc::default())
    }

    /// What the client of `request` may write: by its token, else by its certificate's names.
    pub fn grant_for<T>(&self, request: &Request<T>) -> Result<Grant, WriterDenied> {
        let certs = request.peer_certs();
        self.grant(request.metadata(), certs.as_deref().map(|c| c.as_slice()))
    }

    /// What the client of a call with `metadata` and the TLS chain `certs` (leaf first) may
    /// write.
    pub fn grant(
        &self,
        metadata: &MetadataMap,
        certs: Option<&[CertificateDer<'static>]>,
    ) -> Result<Grant, WriterDenied> {
        let Self::Bound(writers, quota, _) = self else { return Ok(Grant::Anyone) };
        let token = metadata
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        if let Some(token) = token.filter(|t| !t.starts_with(SAN_PREFIX)) {
            return writers
                .get(token)
                .map(|t| Grant::Token(t.clone(), *quota))
                .ok_or(WriterDenied::UnknownToken);
        }
        let Some(leaf) = certs.and_then(|c| c.first()) else { return Err(WriterDenied::NoToken) };
        let names = certificate_names(leaf);
        names
            .iter()
            .find_map(|n| writers.get(&format!("{SAN_PREFIX}{n}")))
            .map(|t| Grant::Token(t.clone(), *quota))
            .ok_or(WriterDenied::UnboundCertificate(names))
    }
}

/// The write rules of a facade: who writes what, and the largest epoch step.
#[derive(Clone, Debug)]
pub struct WriteRules {
    pub writers: WriterPolicy,
    pub max_epoch_step: u64,
}

impl Default for WriteRules {
    fn default() -> Self {
        Self { writers: WriterPolicy::Open, max_epoch_step: DEFAULT_MAX_EPOCH_STEP }
    }
}

/// The DNS and URI subject alternative names of a DER certificate (none if it does not parse:
/// the TLS layer has verified it already).
pub fn certificate_names(der: &CertificateDer<'_>) -> Vec<String> {
    let Ok(cert) = webpki::EndEntityCert::try_from(der) else { return Vec::new() };
    cert.valid_dns_names().chain(cert.valid_uri_names()).map(str::to_string).collect()
}

/// A name a facade refuses to write: control characters (NUL included) and bidirectional
/// overrides or isolates would make logs, metrics and dumps show another name than the one
/// stored.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("name {0:?} has a control or bidirectional-override character; refused")]
pub struct BadName(pub String);

/// `Ok` unless `name` has a character [`BadName`] lists.
pub fn check_name(name: &str) -> Result<(), BadName> {
    let bad = |c: char| {
        c.is_control()
            || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    if name.chars().any(bad) {
        Err(BadName(name.to_string()))
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_token(t: &str) -> MetadataMap {
        let mut m = MetadataMap::new();
        m.insert("authorization", format!("Bearer {t}").parse().unwrap());
        m
    }

    #[test]
    fn tokens_grant_their_names_only() {
        let p = WriterPolicy::parse("# fleet\nt-a gw-a bridge-a-*\n\nt-root *  # ops\n").unwrap();
        let a = p.grant(&with_token("t-a"), None).unwrap();
        assert!(a.allows("gw-a") && a.allows("bridge-a-7"));
        assert!(!a.allows("gw-ab") && !a.allows("gw-b"));
        assert_eq!(a.check("gw-b"), Err(WriterDenied::NotYours("gw-b".into())));
        assert!(p.grant(&with_token("t-root"), None).unwrap().allows("anything"));
        assert_eq!(p.grant(&MetadataMap::new(), None).unwrap_err(), WriterDenied::NoToken);
        assert_eq!(
            p.grant(&with_token("t-x"), None).unwrap_err().status().code(),
            tonic::Code::Unauthenticated
        );
        assert!(WriterPolicy::Open.grant(&MetadataMap::new(), None).unwrap().allows("x"));
    }

    #[test]
    fn a_full_quota_refuses_new_holders_and_keyspaces_only() {
        let quota = WriterQuota { holders: 2, keyspaces: 1 };
        let p = WriterPolicy::parse("t-a *\nt-b *\n").unwrap().with_quota(quota);
        let (a, b) = (p.grant(&with_token("t-a"), None).unwrap(), p.grant(&with_token("t-b"), None).unwrap());
        let (k1, k2) = (KeyspaceId::new("m1", 4, 1), KeyspaceId::new("m2", 4, 1));
        a.admit(1, &k1).unwrap();
        a.admit(2, &k1).unwrap();
        a.admit(2, &k1).unwrap();
        assert_eq!(a.admit(3, &k1), Err(WriterDenied::HolderQuota(2)));
        assert_eq!(a.admit(1, &k2), Err(WriterDenied::KeyspaceQuota(1)));
        assert_eq!(a.admit(3, &k1).unwrap_err().status().code(), tonic::Code::ResourceExhausted);
        b.admit(3, &k2).expect("another writer's quota is its own");
        a.release(2);
        a.admit(3, &k1).expect("a removed holder's place is free again");
        let again = p.grant(&with_token("t-a"), None).unwrap();
        assert_eq!(again.admit(4, &k1), Err(WriterDenied::HolderQuota(2)), "per token, not per call");
    }

    fn cert(name: &str) -> CertificateDer<'static> {
        use rustls_pki_types::pem::PemObject;
        let path = format!("{}/../tests/fixtures/tls/{name}.pem", env!("CARGO_MANIFEST_DIR"));
        CertificateDer::from_pem_file(path).unwrap()
    }

    #[test]
    fn certificates_are_the_writers_of_their_san_lines() {
        assert_eq!(certificate_names(&cert("writer-a")), vec!["writer-a.example"]);
        assert_eq!(certificate_names(&cert("writer-b")), vec!["spiffe://example.org/writer-b"]);
        let p = WriterPolicy::parse("t-a gw-a\nsan:writer-a.example w-a*\n").unwrap();
        let none = MetadataMap::new();
        let a = p.grant(&none, Some(&[cert("writer-a")])).unwrap();
        assert!(a.allows("w-a-1") && !a.allows("gw-a"));
        assert_eq!(a.label(), "san:writer-a.example");
        let by_token = p.grant(&with_token("t-a"), Some(&[cert("writer-a")])).unwrap();
        assert!(by_token.allows("gw-a") && !by_token.allows("w-a-1"), "a token wins over the certificate");
        assert_eq!(by_token.label(), "gw-a", "a token's writer is named by its first pattern, not the token");
        let unbound = p.grant(&none, Some(&[cert("writer-b")])).unwrap_err();
        assert_eq!(unbound, WriterDenied::UnboundCertificate(vec!["spiffe://example.org/writer-b".into()]));
        assert_eq!(unbound.status().code(), tonic::Code::PermissionDenied);
        assert_eq!(p.grant(&with_token("san:writer-a.example"), None).unwrap_err(), WriterDenied::NoToken);
        let nobody = WriterPolicy::nobody().grant(&none, Some(&[cert("writer-a")])).unwrap_err();
        assert_eq!(nobody.status().code(), tonic::Code::PermissionDenied, "mTLS without a writer file");
    }

    #[test]
    fn quota_use_is_seeded_from_recorded_holders() {
        let quota = WriterQuota { holders: 2, keyspaces: 1 };
        let p = WriterPolicy::parse("t-a a-*\nt-all *\n").unwrap().with_quota(quota);
        assert!(p.needs_seed());
        let k1 = KeyspaceId::new("m1", 4, 1);
        p.seed(&[
            (1, "a-1".into(), vec![k1.clone()]),
            (2, "a-2".into(), vec![k1.clone()]),
            (3, "b".into(), vec![]),
        ]);
        assert!(!p.needs_seed());
        let a = p.grant(&with_token("t-a"), None).unwrap();
        assert_eq!(
            a.admit(9, &k1),
            Err(WriterDenied::HolderQuota(2)),
            "a-1 and a-2 are t-a's (its line is first)"
        );
        assert_eq!(a.admit(1, &KeyspaceId::new("m2", 4, 1)), Err(WriterDenied::KeyspaceQuota(1)));
        a.admit(2, &k1).expect("a recorded holder is not new");
        let all = p.grant(&with_token("t-all"), None).unwrap();
        all.admit(4, &k1).unwrap();
        assert_eq!(all.admit(5, &k1), Err(WriterDenied::HolderQuota(2)), "b was counted to t-all");
    }

    #[test]
    fn bad_token_files_are_refused() {
        assert!(matches!(WriterPolicy::parse("t-a\n"), Err(TokenFileError::NoNames { line: 1 })));
        assert!(matches!(WriterPolicy::parse("t a\nt b\n"), Err(TokenFileError::Duplicate { line: 2 })));
        assert!(matches!(WriterPolicy::parse("# none\n"), Err(TokenFileError::Empty)));
    }

    #[test]
    fn control_and_bidi_names_are_refused() {
        assert!(check_name("worker-0#1").is_ok());
        assert!(check_name("wörker").is_ok());
        for bad in ["a\0b", "a\nb", "a\u{202e}b", "a\u{2067}b", "\u{200f}"] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }
}
