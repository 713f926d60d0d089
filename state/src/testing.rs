//! Test-only fault injection (feature `testing`; never in a production build): make applying
//! chosen records panic, as a bug in the apply path would.
//!
//! A record is chosen by its value: applying any record whose value starts with a registered
//! marker panics after the partition's log time has moved (part of the record is applied, as
//! in a real mid-apply bug). Values, not offsets, so that tests sharing a process (and a broker)
//! never hit each other's records, and so that a replica restarted from a checkpoint meets the
//! same record again. A `prefixlog serve` process built with the feature reads one marker from
//! [`PANIC_ON_ENV`] at its first apply.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// Environment variable naming a marker (UTF-8) for processes started by tests.
pub const PANIC_ON_ENV: &str = "PREFIXLOG_TESTING_PANIC_ON";

/// Whether any marker is registered: the common case (none) takes no lock per record.
static ANY: AtomicBool = AtomicBool::new(false);

fn markers() -> &'static Mutex<Vec<Vec<u8>>> {
    static MARKERS: OnceLock<Mutex<Vec<Vec<u8>>>> = OnceLock::new();
    MARKERS.get_or_init(|| {
        let from_env: Vec<Vec<u8>> = std::env::var(PANIC_ON_ENV)
            .ok()
            .filter(|m| !m.is_empty())
            .map(String::into_bytes)
            .into_iter()
            .collect();
        ANY.store(!from_env.is_empty(), Ordering::Release);
        Mutex::new(from_env)
    })
}

/// From now on, applying a record whose value starts with `marker` panics (process-wide).
pub fn panic_on_value(marker: &[u8]) {
    assert!(!marker.is_empty(), "an empty marker would make every record panic");
    markers().lock().push(marker.to_vec());
    ANY.store(true, Ordering::Release);
}

/// Called by the applier before a record's operation is applied.
pub(crate) fn maybe_panic(value: Option<&[u8]>) {
    let m = markers();
    let Some(v) = value.filter(|_| ANY.load(Ordering::Acquire)) else { return };
    let hit = m.lock().iter().any(|m| v.starts_with(m));
    if hit {
        panic!("testing: applying a record marked {:?} panics", String::from_utf8_lossy(v));
    }
}
