//! Recovering what the engine's stream lost, through its replay socket: a sequence gap
//! ([`EngineBridge::fill_gap`]), an engine restart noticed after a re-subscription
//! ([`EngineBridge::probe_restart`]), and a lost tail once the stream goes quiet
//! ([`EngineBridge::probe_tail`]). Where replay cannot cover what was lost, the worker's state
//! is cleared through the log and the stream starts over ([`EngineBridge::reset`]).

use crate::metrics::BridgeMetrics;
use crate::replay::{self, request_replay};
use crate::session::payload_digest;
use crate::{EngineBridge, Replayed};

impl EngineBridge {
    /// The first message after a re-subscription arrived in order: asks the replay socket for
    /// the last message handled and compares it, so an engine that restarted while the bridge
    /// was away and has already numbered up to ours is still told ([`Self::replay_gap`]).
    /// Without a replay socket such a restart is only told by a gap or a sequence going back.
    pub(crate) async fn probe_restart(&mut self, seq: u64) {
        let (Some(ep), Some(last)) = (self.spec.replay_endpoint.clone(), self.session.last_seq()) else {
            return;
        };
        let epoch = self.session.epoch();
        let items = self.replay_gap(&ep, last, seq).await;
        if self.session.epoch() != epoch {
            // Restarted: the new lifetime's messages before `seq` come from the replay.
            BridgeMetrics::inc(&self.metrics.gaps);
            self.apply_replayed(items, seq).await;
            if self.session.expected() != seq {
                self.reset(seq, "the restarted engine's replay did not reach its first message");
            }
        }
    }

    /// Whether [`Self::probe_tail`] has something to ask: a replay socket, a message handled.
    pub(crate) fn can_probe_tail(&self) -> bool {
        !self.opts.tail_probe.is_zero()
            && self.spec.replay_endpoint.is_some()
            && self.session.last_seq().is_some()
    }

    /// The stream has been quiet for `tail_probe`: asks the replay socket for the messages from
    /// the last one handled on and processes those after it. A publisher whose send queue was
    /// full dropped them, and without this nothing would tell until the engine's next message,
    /// which may never come (a removal lost this way would leave blocks credited). An engine that
    /// restarted meanwhile is told as in [`Self::replay_gap`]; a replay that no longer reaches
    /// back starts the stream over ([`Self::apply_replayed`]).
    pub(crate) async fn probe_tail(&mut self) {
        let (Some(ep), Some(last)) = (self.spec.replay_endpoint.clone(), self.session.last_seq()) else {
            return;
        };
        BridgeMetrics::inc(&self.metrics.tail_probes);
        let (epoch, expected) = (self.session.epoch(), self.session.expected());
        let items = self.replay_gap(&ep, last, u64::MAX).await;
        self.apply_replayed(items, u64::MAX).await;
        if self.session.epoch() != epoch || self.session.expected() != expected {
            BridgeMetrics::inc(&self.metrics.tails_recovered);
            tracing::info!(
                worker = self.spec.worker,
                expected,
                now_expected = self.session.expected(),
                "bridge: messages after the last one received were recovered through replay (lost tail)"
            );
        }
    }

    /// Messages `from..seq` are missing: asks the engine's replay socket for them and processes
    /// what it returns in order. Where replay cannot cover the gap (no replay socket, a failed
    /// replay, a buffer that no longer reaches back, a hole in what it returns), the worker's
    /// state is cleared through the log and the stream starts over at the first message it has
    /// ([`Session::reset_at`]): a removal lost in the gap can never leave a block credited, and
    /// the worker is never left gapped.
    pub(crate) async fn fill_gap(&mut self, from: u64, seq: u64) {
        BridgeMetrics::inc(&self.metrics.gaps);
        if let Some(ep) = self.spec.replay_endpoint.clone() {
            let items = self.replay_gap(&ep, from, seq).await;
            self.apply_replayed(items, seq).await;
        }
        if self.session.expected() != seq {
            let why = if self.spec.replay_endpoint.is_some() {
                "the replay did not fill the gap"
            } else {
                "no replay endpoint to fill the gap"
            };
            self.reset(seq, why);
        }
    }

    /// Processes the replayed messages the session expects, up to (not including) `seq`; a hole
    /// in them starts the stream over at the message after it.
    async fn apply_replayed(&mut self, items: Replayed, seq: u64) {
        for (s, p) in items {
            if s < self.session.expected() || s >= seq {
                continue;
            }
            if s != self.session.expected() {
                self.reset(s, "the replay does not reach back to the gap's start");
            }
            BridgeMetrics::inc(&self.metrics.messages_received);
            BridgeMetrics::inc(&self.metrics.replayed_batches);
            self.process(s, &p).await;
        }
    }

    /// Asks for the gap from the last message already handled, not the first missing one: if
    /// the engine's copy of it differs, the engine restarted meanwhile (and has already published
    /// past our last seq, so the sequence did not go back): a new epoch, replayed from 0.
    async fn replay_gap(&mut self, endpoint: &str, from: u64, seq: u64) -> Replayed {
        let probe = self.session.last_seq();
        let mut items = self.replay(endpoint, probe.unwrap_or(from)).await;
        if let (Some(l), Some((s0, p0))) = (probe, items.first()) {
            let seen = self.session.digest_of(l);
            if *s0 == l && seen.is_some() && seen != Some(payload_digest(p0)) {
                BridgeMetrics::inc(&self.metrics.epochs);
                tracing::info!(
                    worker = self.spec.worker,
                    seq,
                    new_epoch = self.session.epoch() + 1,
                    "bridge: engine restarted (replayed seq {l} differs), new epoch"
                );
                self.session.restart();
                items = self.replay(endpoint, 0).await;
            }
        }
        items
    }

    /// Starts the stream over at message `seq` in a new epoch (see [`Self::fill_gap`]).
    pub(crate) fn reset(&mut self, seq: u64, why: &str) {
        BridgeMetrics::inc(&self.metrics.resets_gap);
        tracing::warn!(
            worker = self.spec.worker,
            expected = self.session.expected(),
            seq,
            new_epoch = self.session.epoch() + 1,
            "bridge: {why}; clearing the worker's state through the log (new epoch) and starting over at seq {seq}"
        );
        self.session.reset_at(seq);
    }

    /// One replay request; a failure is counted and logged, and gives nothing.
    async fn replay(&self, endpoint: &str, start: u64) -> Replayed {
        let limits = replay::ReplayLimits {
            timeout: self.opts.replay_timeout,
            max_bytes: self.opts.max_replay_bytes,
            max_frame_bytes: self.opts.max_frame_bytes,
            topic: self.spec.topic.as_bytes().to_vec(),
        };
        match request_replay(endpoint, start, &limits).await {
            Ok(items) => {
                BridgeMetrics::inc(&self.metrics.replays_ok);
                items
            }
            Err(e) => {
                let outcome = if e.is_oversized() {
                    &self.metrics.replays_oversized
                } else {
                    &self.metrics.replays_failed
                };
                BridgeMetrics::inc(outcome);
                tracing::warn!(worker = self.spec.worker, start, error = %e, "bridge: replay failed");
                Vec::new()
            }
        }
    }
}
