//! Request validation: every field is checked before the engine is touched, so a gateway gets
//! a precise status instead of a silently empty answer.

use crate::error::{clip, QueryError};
use prefixlog_engine::{scheme, KeyspaceId};
use prefixlog_proto::v1::{match_request::Prompt, MatchRequest, PartitionOffset};
use prefixlog_state::NextOffset;

/// How many known keyspaces a NOT_FOUND message names at most: the message travels in gRPC
/// metadata (8 KiB soft limit), and a replica may hold hundreds of keyspaces.
const KNOWN_KEYSPACES_SHOWN: usize = 5;
/// Most `candidate_workers` a request may name: far more than any fleet a gateway routes to,
/// and small enough that copying and sorting them stays cheap next to the match.
pub const MAX_CANDIDATES: usize = 65_536;
/// Largest `TokenIds.lookahead`: vLLM's lookahead is a drafter's few tokens; a bound keeps the
/// per-block key proportional to the block.
pub const MAX_LOOKAHEAD: u32 = 1024;
/// Most `TokenIds.mm_inputs` a request may name (each costs a key per block it overlaps).
pub const MAX_MM_INPUTS: usize = 4096;

/// A validated request.
pub struct Checked {
    pub keyspace: KeyspaceId,
    pub locals: Vec<u64>,
    pub top_k: Option<usize>,
    /// Consistency token in next offsets, for partitions that exist.
    pub token: Vec<NextOffset>,
    /// Sorted, deduplicated; empty = every worker.
    pub candidates: Vec<u64>,
}

pub fn check(req: &MatchRequest, max_blocks: usize, partition_count: u32) -> Result<Checked, QueryError> {
    let ks = req.keyspace.as_ref().ok_or_else(|| QueryError::invalid("keyspace is required"))?;
    if ks.block_size == 0 {
        return Err(QueryError::invalid("keyspace.block_size must be > 0"));
    }
    if ks.model.is_empty() {
        return Err(QueryError::invalid("keyspace.model must not be empty"));
    }
    let keyspace = KeyspaceId::new(ks.model.clone(), ks.block_size, ks.hash_scheme);
    let locals = locals(&keyspace, req.prompt.as_ref(), max_blocks)?;
    let top_k = match req.top_k {
        Some(0) => return Err(QueryError::invalid("top_k must be at least 1 (omit it for every worker)")),
        k => k.map(|k| k as usize),
    };
    let token = token(&req.min_offsets, partition_count)?;
    if req.candidate_workers.len() > MAX_CANDIDATES {
        return Err(QueryError::invalid(format!(
            "{} candidate_workers; at most {MAX_CANDIDATES}",
            req.candidate_workers.len()
        )));
    }
    crate::tiers::tier_options(req)?;
    let mut candidates = req.candidate_workers.clone();
    candidates.sort_unstable();
    candidates.dedup();
    Ok(Checked { keyspace, locals, top_k, token, candidates })
}

/// The prompt's local hashes. Token ids are hashed with the keyspace's scheme; a prompt
/// shorter than one block is valid and matches nothing (engines cache full blocks only).
fn locals(id: &KeyspaceId, prompt: Option<&Prompt>, max_blocks: usize) -> Result<Vec<u64>, QueryError> {
    let too_many = |n: usize| {
        QueryError::invalid(format!("prompt has {n} blocks; this replica's limit is {max_blocks}"))
    };
    match prompt {
        None => Err(QueryError::invalid("empty prompt: set tokens or hashes")),
        Some(Prompt::Hashes(h)) if h.local.is_empty() => {
            Err(QueryError::invalid("empty prompt: no block hashes"))
        }
        Some(Prompt::Hashes(h)) if h.local.len() > max_blocks => Err(too_many(h.local.len())),
        Some(Prompt::Hashes(h)) => Ok(h.local.clone()),
        Some(Prompt::Tokens(t)) => {
            if t.ids.is_empty() {
                return Err(QueryError::invalid("empty prompt: no token ids"));
            }
            if !scheme::is_known(id.scheme) {
                return Err(QueryError::invalid(format!(
                    "unknown hash scheme {} for token ids (this replica hashes scheme {}); \
                     send precomputed block hashes instead",
                    id.scheme,
                    scheme::SCHEME_XXH3_CHAINED
                )));
            }
            if t.lookahead > MAX_LOOKAHEAD {
                return Err(QueryError::invalid(format!(
                    "lookahead {} is over this replica's limit of {MAX_LOOKAHEAD} tokens",
                    t.lookahead
                )));
            }
            if t.mm_inputs.len() > MAX_MM_INPUTS {
                return Err(QueryError::invalid(format!(
                    "{} mm_inputs; at most {MAX_MM_INPUTS}",
                    t.mm_inputs.len()
                )));
            }
            let n = scheme::hashable_blocks(t.ids.len(), id.block_size as usize, t.lookahead as usize);
            if n > max_blocks {
                return Err(too_many(n));
            }
            Ok(token_locals(t, id.block_size as usize))
        }
    }
}

/// A token prompt's locals with its namespace inputs (LoRA name, cache salt, per-block keys,
/// placed multimodal inputs, lookahead).
fn token_locals(t: &prefixlog_proto::v1::TokenIds, block_size: usize) -> Vec<u64> {
    let extra: Vec<(usize, Vec<&str>)> =
        t.extra.iter().map(|e| (e.block as usize, e.mm_ids.iter().map(String::as_str).collect())).collect();
    let mm: Vec<scheme::MmInput<'_>> = t
        .mm_inputs
        .iter()
        .map(|m| scheme::MmInput { id: &m.id, offset: m.offset, length: m.length })
        .collect();
    let ns = scheme::Namespace {
        lora: &t.namespace,
        cache_salt: &t.cache_salt,
        extra: &extra,
        mm_inputs: &mm,
        lookahead: t.lookahead as usize,
    };
    scheme::block_hashes_with(&ns, &t.ids, block_size)
}

/// The token as one (partition, next offset) per partition, ascending; a partition named more
/// than once (a token built from several publishes, or merged from two) keeps its largest
/// offset. One linear pass: the wait re-checks the token on every applied record, so its
/// length is bounded by the log's partitions, whatever the request's.
fn token(offs: &[PartitionOffset], partitions: u32) -> Result<Vec<NextOffset>, QueryError> {
    let mut largest: Vec<Option<i64>> = Vec::new();
    for o in offs {
        if o.partition >= partitions {
            return Err(QueryError::invalid(format!(
                "consistency token names partition {} but the log has {partitions}",
                o.partition
            )));
        }
        if largest.is_empty() {
            largest = vec![None; partitions as usize];
        }
        let slot = &mut largest[o.partition as usize];
        *slot = Some(slot.map_or(o.offset, |x| x.max(o.offset)));
    }
    Ok(largest.into_iter().enumerate().filter_map(|(p, o)| Some(NextOffset::new(p as u32, o?))).collect())
}

/// NOT_FOUND for an unknown keyspace, naming a few known ones, under 1 KiB whatever the names
/// (model names are client-controlled, and a replica may hold hundreds of keyspaces).
pub fn unknown_keyspace(id: &KeyspaceId, known: &[KeyspaceId]) -> QueryError {
    let shown: Vec<String> =
        known.iter().take(KNOWN_KEYSPACES_SHOWN).map(|k| clip(&k.to_string(), 120)).collect();
    let more = known.len().saturating_sub(shown.len());
    let msg = format!(
        "no keyspace {} on this replica (model/block size/hash scheme must match what the workers \
         publish); {} known{}: [{}]",
        clip(&id.to_string(), 200),
        known.len(),
        if more > 0 { format!(", {more} not shown") } else { String::new() },
        shown.join(", "),
    );
    QueryError::UnknownKeyspace(msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_found_stays_small_with_many_and_long_keyspaces() {
        let known: Vec<KeyspaceId> =
            (0..400).map(|i| KeyspaceId::new(format!("model-{i}-{}", "x".repeat(300)), 16, 1)).collect();
        let s = tonic::Status::from(unknown_keyspace(&KeyspaceId::new("y".repeat(5000), 16, 1), &known));
        assert_eq!(s.code(), tonic::Code::NotFound);
        assert!(s.message().len() <= 1000, "{}", s.message().len());
        let s = tonic::Status::from(unknown_keyspace(&KeyspaceId::new("m", 16, 1), &known[..7]));
        assert!(s.message().contains("7 known, 2 not shown"), "{}", s.message());
    }

    fn request(min_offsets: Vec<PartitionOffset>, candidate_workers: Vec<u64>) -> MatchRequest {
        MatchRequest {
            keyspace: Some(prefixlog_proto::v1::Keyspace {
                model: "m".into(),
                block_size: 4,
                hash_scheme: 1,
            }),
            prompt: Some(Prompt::Hashes(prefixlog_proto::v1::BlockHashes { local: vec![1] })),
            min_offsets,
            candidate_workers,
            ..Default::default()
        }
    }

    #[test]
    fn a_token_is_one_entry_per_partition_with_the_largest_offset() {
        let po = |partition, offset| PartitionOffset { partition, offset };
        let c = check(&request(vec![po(2, 5), po(0, 9), po(2, 7), po(2, -1)], vec![]), 10, 4).unwrap();
        assert_eq!(c.token, vec![NextOffset::new(0, 9), NextOffset::new(2, 7)]);
        // Many entries (a token built from many publishes) fold into one per partition.
        let many = (0..100_000).map(|i| po(i % 4, i64::from(i))).collect();
        let c = check(&request(many, vec![]), 10, 4).unwrap();
        let n = NextOffset::new;
        assert_eq!(c.token, vec![n(0, 99_996), n(1, 99_997), n(2, 99_998), n(3, 99_999)]);
        let err = check(&request(vec![po(4, 1)], vec![]), 10, 4).err().expect("no partition 4");
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
    }

    #[test]
    fn candidate_workers_are_bounded() {
        let ok = check(&request(vec![], (0..MAX_CANDIDATES as u64).rev().collect()), 10, 1).unwrap();
        assert_eq!(ok.candidates.len(), MAX_CANDIDATES);
        assert!(ok.candidates.windows(2).all(|w| w[0] < w[1]), "sorted");
        let err = check(&request(vec![], vec![7; MAX_CANDIDATES + 1]), 10, 1).err().expect("too many");
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
    }

    /// A token prompt's cache salt and per-block multimodal identifiers are hashed with the
    /// scheme's rule (as the bridge hashes an engine's keyed blocks); without them the same
    /// tokens are other blocks.
    #[test]
    fn token_prompts_hash_their_salt_and_multimodal_keys() {
        use prefixlog_proto::v1::{BlockExtraKeys, Keyspace, TokenIds};
        let ids: Vec<u32> = (1..=12).collect();
        let ask = |t: TokenIds| {
            let req = MatchRequest {
                keyspace: Some(Keyspace { model: "m".into(), block_size: 4, hash_scheme: 1 }),
                prompt: Some(Prompt::Tokens(t)),
                ..Default::default()
            };
            check(&req, 10, 1).unwrap().locals
        };
        let keyed = TokenIds {
            ids: ids.clone(),
            namespace: "lora".into(),
            cache_salt: "tenant".into(),
            extra: vec![
                BlockExtraKeys { block: 1, mm_ids: vec!["img".into()] },
                BlockExtraKeys { block: 2, mm_ids: vec!["img".into()] },
                BlockExtraKeys { block: 9, mm_ids: vec!["past the prompt".into()] },
            ],
            ..Default::default()
        };
        let img = [(1, vec!["img"]), (2, vec!["img"])];
        let ns = scheme::Namespace { lora: "lora", cache_salt: "tenant", extra: &img, ..Default::default() };
        let got = ask(keyed.clone());
        assert_eq!(got, scheme::block_hashes_with(&ns, &ids, 4));
        let unsalted = ask(TokenIds { cache_salt: String::new(), ..keyed.clone() });
        assert!(got.iter().zip(&unsalted).all(|(a, b)| a != b), "the salt changes every block");
        let no_image = ask(TokenIds { extra: vec![], ..keyed });
        assert_eq!((got[0] == no_image[0], got[1] == no_image[1]), (true, false));
        let plain = ask(TokenIds { ids: ids.clone(), ..Default::default() });
        assert_eq!(plain, scheme::block_hashes(&ids, 4), "plain prompts hash as before");
        // Placed inputs and lookahead reach the scheme as given.
        let placed = TokenIds {
            ids: ids.clone(),
            mm_inputs: vec![prefixlog_proto::v1::MultimodalInput { id: "img".into(), offset: 2, length: 5 }],
            lookahead: 1,
            ..Default::default()
        };
        let mm = [scheme::MmInput { id: "img", offset: 2, length: 5 }];
        let ns = scheme::Namespace { mm_inputs: &mm, lookahead: 1, ..Default::default() };
        assert_eq!(ask(placed), scheme::block_hashes_with(&ns, &ids, 4));
    }

    #[test]
    fn top_k_zero_is_invalid() {
        let req = MatchRequest {
            keyspace: Some(prefixlog_proto::v1::Keyspace {
                model: "m".into(),
                block_size: 4,
                hash_scheme: 1,
            }),
            prompt: Some(Prompt::Hashes(prefixlog_proto::v1::BlockHashes { local: vec![1] })),
            top_k: Some(0),
            ..Default::default()
        };
        assert_eq!(check(&req, 10, 1).err().map(|s| s.code()), Some(tonic::Code::InvalidArgument));
    }
}
