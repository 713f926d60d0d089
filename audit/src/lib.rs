//! Audits: the index state at any past point, rebuilt from a retained checkpoint plus an exact
//! replay of the log, and what the index would have answered then.
//!
//! Because a replica's state is a pure function of the log prefix it applied and its state
//! settings, the state "as of next offsets O" is: the newest retained checkpoint whose offsets
//! are all ≤ O, then every record in `[checkpoint offset, O)` per partition, applied with the
//! checkpoint's settings. "As of log time T" is the prefix of each partition up to (not
//! including) its first record stamped after T; prefixlog never asks the broker's time index
//! (the embedded broker lacks it and retention drops it): checkpoints record each partition's
//! (offset, log time), and the replay scans forward from there. Replays go through
//! `prefixlog_ingest::apply_log`, the one bounded reader: a target is reached exactly or the
//! audit fails.
//!
//! Module map:
//! - [`reconstruct`]: choose the checkpoint, replay to the point, [`Reconstructed`] state.
//! - [`queries`]: JSON queries in and answers out, summaries.
//! - [`verify`]: replay a range and check every retained checkpoint in it is reproduced.
//! - [`loss`]: routing-loss attribution: a placement's decision and the totals over many;
//!   [`loss_judge`]: every placement in a range judged at its answer token's offsets, in one
//!   read and one application of the range; [`loss_report`]: its table and JSON lines;
//!   [`loss_svg`]: lost prefill tokens over time per gateway, as an SVG plot;
//!   [`loss_follow`]: the same as a continuous job exporting Prometheus counters.

pub mod loss;
pub mod loss_follow;
pub mod loss_judge;
pub mod loss_report;
pub mod loss_svg;
pub mod queries;
pub mod reconstruct;
pub mod verify;

pub use loss::{Decision, LossOptions, LossReport, LossTotals, Placed, Tally};
pub use loss_judge::judge_range;
pub use reconstruct::{
    advance, advance_observed, reconstruct, reconstruct_at, AuditError, Point, Reconstructed,
};
pub use verify::{verify, VerifyReport};
