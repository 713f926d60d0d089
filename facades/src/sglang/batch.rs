//! `ApplyExternalKvBatch`: validation (all or nothing, upstream's statuses) and the mapping of
//! SGLang actions to prefixlog KV ops.
//!
//! Tiers map onto prefixlog's storage tiers: HBM → gpu, DRAM → host, SSD → disk.
//!
//! | action | op |
//! |---|---|
//! | REPORT, no component masks (or all 0) | `BlocksStored{tier, lane 0, parent_ext = parent_block_hash, ext = local = hashes}` |
//! | REVOKE | `BlocksRemoved{tier, lane 0, ext = hashes}` |
//! | CLEAR_ALL_AT_TIER, any tier | `AllBlocksCleared{lane 0}`: every tier of the worker |
//! | REPORT with a non-zero component mask | skipped, reason `components_unsupported` |
//!
//! A clear empties every tier because a log record has no one-tier clear. Clearing more than
//! was cleared only under-matches: the worker's other tiers count nothing until their blocks
//! are stored again. The sgl bridge clears every tier at once anyway (its default
//! `KV_INDEXER_CLEAR_TIERS`). Skipping never
//! overcounts either: a block not stored is only ever under-matched. A REPORT with component
//! masks (hybrid SWA/Mamba models) is skipped because crediting its FULL blocks alone would
//! ignore the reuse rules of its other components.

use super::pb::{ApplyExternalKvBatchRequest, ExternalKvAction, ExternalKvActionType};
use super::{MAX_ACTIONS, MAX_BATCH_HASHES, MAX_WORKER_ID_BYTES, SGLANG_LANE, SGLANG_TIERS};
use prefixlog_state::BlockHashes;
use prefixlog_state::{KvOp, Tier};
use tonic::Status;

/// Why a batch is refused (nothing of it is applied).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BatchError {
    #[error("worker_id must not be empty")]
    NoWorkerId,
    #[error("worker_id has {0} bytes; at most {MAX_WORKER_ID_BYTES}")]
    WorkerIdTooLong(usize),
    #[error(transparent)]
    BadName(#[from] crate::writers::BadName),
    #[error("{0} actions in one batch; at most {MAX_ACTIONS}")]
    TooManyActions(usize),
    #[error("{0} hashes in one batch; at most {MAX_BATCH_HASHES}")]
    TooManyHashes(usize),
    #[error("action {index}: tier {tier} is not TIER_HBM (1), TIER_DRAM (2) or TIER_SSD (3)")]
    BadTier { index: usize, tier: i32 },
    #[error("action {index}: action type {kind} is not REPORT (1), REVOKE (2) or CLEAR_ALL_AT_TIER (3)")]
    BadType { index: usize, kind: i32 },
    #[error("action {index}: REPORT and REVOKE need at least one hash")]
    NoHashes { index: usize },
    #[error("action {index}: {field} has {got} entries for {hashes} hashes (none, or one per hash)")]
    BadPerHash { index: usize, field: &'static str, got: usize, hashes: usize },
}

impl BatchError {
    /// Upstream's status for it: size limits are RESOURCE_EXHAUSTED, the rest INVALID_ARGUMENT.
    pub fn status(&self) -> Status {
        match self {
            Self::TooManyActions(_) | Self::TooManyHashes(_) => Status::resource_exhausted(self.to_string()),
            _ => Status::invalid_argument(self.to_string()),
        }
    }
}

/// A worker name the facade accepts: not empty, and bounded.
pub fn check_worker_id(name: &str) -> Result<(), BatchError> {
    match name.len() {
        0 => Err(BatchError::NoWorkerId),
        n if n > MAX_WORKER_ID_BYTES => Err(BatchError::WorkerIdTooLong(n)),
        _ => Ok(crate::writers::check_name(name)?),
    }
}

/// Checks a whole batch before anything of it is published.
pub fn validate(req: &ApplyExternalKvBatchRequest) -> Result<(), BatchError> {
    check_worker_id(&req.worker_id)?;
    if req.actions.len() > MAX_ACTIONS {
        return Err(BatchError::TooManyActions(req.actions.len()));
    }
    let hashes: usize = req.actions.iter().map(|a| a.hashes.len()).sum();
    if hashes > MAX_BATCH_HASHES {
        return Err(BatchError::TooManyHashes(hashes));
    }
    req.actions.iter().enumerate().try_for_each(|(index, a)| validate_action(index, a))
}

fn validate_action(index: usize, a: &ExternalKvAction) -> Result<(), BatchError> {
    if tier_of(a.tier).is_none() {
        return Err(BatchError::BadTier { index, tier: a.tier });
    }
    let kind = match ExternalKvActionType::try_from(a.r#type) {
        Ok(ExternalKvActionType::ActionUnknown) | Err(_) => {
            return Err(BatchError::BadType { index, kind: a.r#type })
        }
        Ok(k) => k,
    };
    if kind != ExternalKvActionType::ActionClearAllAtTier && a.hashes.is_empty() {
        return Err(BatchError::NoHashes { index });
    }
    let per_hash = |field: &'static str, got: usize| {
        if got == 0 || got == a.hashes.len() {
            Ok(())
        } else {
            Err(BatchError::BadPerHash { index, field, got, hashes: a.hashes.len() })
        }
    };
    per_hash("component_masks", a.component_masks.len())?;
    per_hash("block_sizes", a.block_sizes.len())
}

/// Actions not applied, by reason (the `reason` label of the skipped counter).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Skipped {
    /// A REPORT with non-zero component masks (hybrid models).
    pub components: u64,
}

impl Skipped {
    pub fn reasons(&self) -> [(&'static str, u64); 1] {
        [("components_unsupported", self.components)]
    }
}

/// The storage tier an SGLang tier code is filed on (`SGLANG_TIERS`; `validate` refuses others).
fn tier_of(code: i32) -> Option<Tier> {
    SGLANG_TIERS.iter().find(|(t, _)| *t as i32 == code).map(|&(_, tier)| tier)
}

/// The ops of a validated batch, in order, and what was skipped.
pub fn map_actions(actions: &[ExternalKvAction]) -> (Vec<KvOp>, Skipped) {
    let mut skipped = Skipped::default();
    let mut ops = Vec::with_capacity(actions.len());
    for a in actions {
        // Refused by `validate`.
        let Some(tier) = tier_of(a.tier) else { continue };
        let bits = |hs: &[i64]| hs.iter().map(|&h| h as u64).collect::<Vec<u64>>();
        match ExternalKvActionType::try_from(a.r#type) {
            Ok(ExternalKvActionType::ActionReport) if a.component_masks.iter().any(|&m| m != 0) => {
                skipped.components += 1;
            }
            Ok(ExternalKvActionType::ActionReport) => ops.push(KvOp::Stored {
                tier,
                lane: SGLANG_LANE,
                parent_ext: a.parent_block_hash.map(|p| p as u64),
                blocks: a.hashes.iter().map(|&h| BlockHashes::new(h as u64, h as u64)).collect(),
            }),
            Ok(ExternalKvActionType::ActionRevoke) => {
                ops.push(KvOp::Removed { tier, lane: SGLANG_LANE, exts: bits(&a.hashes) })
            }
            Ok(ExternalKvActionType::ActionClearAllAtTier) => ops.push(KvOp::Cleared { lane: SGLANG_LANE }),
            // Refused by `validate`.
            Ok(ExternalKvActionType::ActionUnknown) | Err(_) => {}
        }
    }
    (ops, skipped)
}

#[cfg(test)]
mod tests {
    use super::super::pb::TierType;
    use super::*;
    use prefixlog_state::BlockHashes;

    fn action(kind: ExternalKvActionType, tier: TierType, hashes: Vec<i64>) -> ExternalKvAction {
        ExternalKvAction { r#type: kind as i32, tier: tier as i32, hashes, ..Default::default() }
    }

    fn batch(actions: Vec<ExternalKvAction>) -> ApplyExternalKvBatchRequest {
        ApplyExternalKvBatchRequest { worker_id: "w".into(), actions, ..Default::default() }
    }

    use ExternalKvActionType::*;
    use TierType::*;

    #[test]
    fn refusals_carry_upstreams_statuses() {
        let code = |r: ApplyExternalKvBatchRequest| validate(&r).err().map(|e| e.status().code());
        let mut no_worker = batch(vec![]);
        no_worker.worker_id.clear();
        assert_eq!(code(no_worker), Some(tonic::Code::InvalidArgument));
        let mut long_name = batch(vec![]);
        long_name.worker_id = "w".repeat(MAX_WORKER_ID_BYTES + 1);
        assert_eq!(code(long_name.clone()), Some(tonic::Code::InvalidArgument));
        long_name.worker_id.pop();
        assert_eq!(code(long_name), None, "a name of the longest length is taken");
        assert_eq!(code(batch(vec![])), None, "an empty batch refreshes the address");
        let many = vec![action(ActionClearAllAtTier, TierHbm, vec![]); MAX_ACTIONS + 1];
        assert_eq!(code(batch(many)), Some(tonic::Code::ResourceExhausted));
        let at_limit = vec![action(ActionClearAllAtTier, TierHbm, vec![]); MAX_ACTIONS];
        assert_eq!(code(batch(at_limit)), None);
        let big = vec![action(ActionReport, TierHbm, vec![1; MAX_BATCH_HASHES / 2 + 1]); 2];
        assert_eq!(code(batch(big)), Some(tonic::Code::ResourceExhausted));
        assert_eq!(
            code(batch(vec![action(ActionReport, TierUnknown, vec![1])])),
            Some(tonic::Code::InvalidArgument)
        );
        let mut bad_tier = action(ActionReport, TierHbm, vec![1]);
        bad_tier.tier = 9;
        assert_eq!(code(batch(vec![bad_tier])), Some(tonic::Code::InvalidArgument));
        assert_eq!(
            code(batch(vec![action(ActionUnknown, TierHbm, vec![1])])),
            Some(tonic::Code::InvalidArgument)
        );
        let mut bad_type = action(ActionReport, TierHbm, vec![1]);
        bad_type.r#type = 7;
        assert_eq!(code(batch(vec![bad_type])), Some(tonic::Code::InvalidArgument));
        assert_eq!(
            code(batch(vec![action(ActionReport, TierHbm, vec![])])),
            Some(tonic::Code::InvalidArgument)
        );
        assert_eq!(
            code(batch(vec![action(ActionRevoke, TierDram, vec![])])),
            Some(tonic::Code::InvalidArgument)
        );
        let mut masks = action(ActionReport, TierHbm, vec![1, 2]);
        masks.component_masks = vec![1];
        assert_eq!(code(batch(vec![masks.clone()])), Some(tonic::Code::InvalidArgument));
        masks.component_masks = vec![1, 1];
        assert_eq!(code(batch(vec![masks])), None);
        let mut sizes = action(ActionReport, TierHbm, vec![1, 2]);
        sizes.block_sizes = vec![4, 4, 4];
        let err = validate(&batch(vec![action(ActionClearAllAtTier, TierSsd, vec![]), sizes])).unwrap_err();
        assert_eq!(err, BatchError::BadPerHash { index: 1, field: "block_sizes", got: 3, hashes: 2 });
    }

    /// Each tier's actions reach the log on that tier; a clear at any tier clears them all.
    #[test]
    fn tiers_map_onto_storage_tiers_and_hybrid_reports_are_counted() {
        let mut parented = action(ActionReport, TierHbm, vec![-3, 5]);
        parented.parent_block_hash = Some(-1);
        let mut hybrid = action(ActionReport, TierHbm, vec![9]);
        hybrid.component_masks = vec![2];
        let (ops, skipped) = map_actions(&[
            action(ActionReport, TierHbm, vec![7, 8]),
            parented,
            action(ActionReport, TierDram, vec![7]),
            action(ActionRevoke, TierHbm, vec![8]),
            action(ActionRevoke, TierSsd, vec![7]),
            hybrid,
            action(ActionClearAllAtTier, TierHbm, vec![]),
            action(ActionClearAllAtTier, TierDram, vec![]),
            action(ActionClearAllAtTier, TierSsd, vec![]),
        ]);
        assert_eq!(
            ops,
            vec![
                KvOp::Stored {
                    tier: Tier::Gpu,
                    lane: 0,
                    parent_ext: None,
                    blocks: [(7, 7), (8, 8)].map(BlockHashes::from).to_vec()
                },
                KvOp::Stored {
                    tier: Tier::Gpu,
                    lane: 0,
                    parent_ext: Some(u64::MAX),
                    blocks: [((-3i64) as u64, (-3i64) as u64), (5, 5)].map(BlockHashes::from).to_vec()
                },
                KvOp::Stored {
                    tier: Tier::Host,
                    lane: 0,
                    parent_ext: None,
                    blocks: [(7, 7)].map(BlockHashes::from).to_vec()
                },
                KvOp::Removed { tier: Tier::Gpu, lane: 0, exts: vec![8] },
                KvOp::Removed { tier: Tier::Disk, lane: 0, exts: vec![7] },
                KvOp::Cleared { lane: 0 },
                KvOp::Cleared { lane: 0 },
                KvOp::Cleared { lane: 0 },
            ]
        );
        assert_eq!(skipped, Skipped { components: 1 });
        // All-zero masks are plain FULL blocks.
        let mut zero = action(ActionReport, TierHbm, vec![1]);
        zero.component_masks = vec![0];
        assert_eq!(map_actions(&[zero]).1, Skipped::default());
    }
}
