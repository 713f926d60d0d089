//! Storage tiers on the query path: a request's tier order and weights checked and turned into
//! the engine's options, and an engine answer into a `WorkerScore` with its per-tier parts.

use crate::error::QueryError;
use prefixlog_engine::{HolderMatch, Tier};
use prefixlog_proto::v1::{Interval, MatchRequest, TierDepth, TierRun, WorkerScore};

/// The highest weight: a block on that tier is worth one whole block.
const MAX_PER_MILLE: u32 = 1000;

/// The request's tier order (empty: every tier) and weights, or INVALID_ARGUMENT naming what
/// is wrong: a code outside `StorageTier`, a tier named twice, a weight above 1000.
pub fn tier_options(req: &MatchRequest) -> Result<(Vec<Tier>, Option<[u32; 4]>), QueryError> {
    let mut order = Vec::with_capacity(req.tiers.len());
    for &code in &req.tiers {
        let tier = known(code, "tiers")?;
        if order.contains(&tier) {
            return Err(QueryError::invalid(format!("tiers names {tier} twice")));
        }
        order.push(tier);
    }
    if req.tier_weights.is_empty() {
        return Ok((order, None));
    }
    let mut weights = [0u32; 4];
    let mut seen = [false; 4];
    for w in &req.tier_weights {
        let tier = known(w.tier, "tier_weights")?;
        let i = tier.code() as usize;
        if std::mem::replace(&mut seen[i], true) {
            return Err(QueryError::invalid(format!("tier_weights names {tier} twice")));
        }
        if w.per_mille > MAX_PER_MILLE {
            return Err(QueryError::invalid(format!(
                "tier_weights: {tier} weighs {} per mille; at most {MAX_PER_MILLE}",
                w.per_mille
            )));
        }
        weights[i] = w.per_mille;
    }
    Ok((order, Some(weights)))
}

fn known(code: i32, field: &str) -> Result<Tier, QueryError> {
    u32::try_from(code)
        .ok()
        .and_then(Tier::from_code)
        .ok_or_else(|| QueryError::invalid(format!("{field}: unknown storage tier {code}")))
}

/// An engine answer on the wire.
pub fn worker_score(m: HolderMatch) -> WorkerScore {
    WorkerScore {
        worker: m.holder.worker,
        dp_rank: m.holder.dp_rank,
        lane: m.holder.lane,
        depth: m.depth,
        total_blocks: m.total,
        inferred: m.inferred,
        intervals: m.intervals().iter().map(|&(start, end)| Interval { start, end }).collect(),
        gapped: m.gapped,
        tiers: m
            .tiers()
            .iter()
            .map(|t| TierDepth { tier: t.tier.code() as i32, depth: t.depth, total_blocks: t.total })
            .collect(),
        runs: m.runs().iter().map(|r| TierRun { tier: r.tier.code() as i32, blocks: r.blocks }).collect(),
        weighted_score: m.weighted.unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prefixlog_proto::v1::TierWeight;

    fn req(tiers: Vec<i32>, weights: Vec<(i32, u32)>) -> MatchRequest {
        MatchRequest {
            tiers,
            tier_weights: weights
                .into_iter()
                .map(|(tier, per_mille)| TierWeight { tier, per_mille })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn orders_and_weights_are_read() {
        let (order, w) = tier_options(&req(vec![1, 0], vec![(0, 1000), (1, 600)])).unwrap();
        assert_eq!(order, vec![Tier::Host, Tier::Gpu]);
        assert_eq!(w, Some([1000, 600, 0, 0]));
        assert_eq!(tier_options(&req(vec![], vec![])).unwrap(), (vec![], None));
    }

    #[test]
    fn unknown_repeated_and_overweight_tiers_are_invalid() {
        for r in [
            req(vec![4], vec![]),
            req(vec![-1], vec![]),
            req(vec![2, 2], vec![]),
            req(vec![], vec![(9, 1)]),
            req(vec![], vec![(1, 1), (1, 2)]),
            req(vec![], vec![(0, 1001)]),
        ] {
            let e = tier_options(&r).expect_err("invalid");
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{r:?}");
        }
    }
}
