//! The one interface every implementation under test is driven through.
//!
//! Adding an implementation = one file with one `impl Index for ...` block, plus one line in
//! `registry()` (main.rs). All hashes are the workload's: `ext` is the engine's chained sequence
//! hash (the removal key), `local` the position-independent content hash (the matching key).

use prefixlog_workload::BlockHashes;

/// A prefix index as the harness sees it. Single caller thread; `&mut self` everywhere so
/// adapters may keep scratch buffers.
pub trait Index {
    /// Short stable name (used in the table and by `--only`).
    fn name(&self) -> &str;

    /// `worker` stored `blocks`, extending its chain that ends at `parent`
    /// (`None` = the chain starts at position 0).
    fn stored(&mut self, worker: u32, parent: Option<u64>, blocks: &[BlockHashes]);

    /// `worker` evicted the blocks with these ext hashes.
    fn removed(&mut self, worker: u32, exts: &[u64]);

    /// For the chain of local hashes, every worker holding a non-empty prefix of it, with the
    /// number of contiguous blocks from position 0 it holds. Any order; depth-0 rows allowed
    /// (the harness drops them).
    fn query(&mut self, locals: &[u64]) -> Vec<(u32, u32)>;

    /// Make every write issued so far visible to `query` (no-op for synchronous indexes). The
    /// harness calls it before every query and once at the end, and counts it as write time.
    fn flush(&mut self) {}

    /// Free-form counters printed after the run (e.g. rejected events).
    fn notes(&self) -> String {
        String::new()
    }
}
