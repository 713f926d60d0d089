//! CPU sets for threads (Linux `sched_setaffinity`). `serve --ingest-cpus` pins the ingest
//! thread, and with it the Kafka client's threads (librdkafka starts them from the thread that
//! creates the client, and a new thread inherits its creator's set), so that a catch-up at full
//! speed cannot preempt the threads answering queries, nor be preempted by them while it holds
//! a keyspace's write lock (README "Queries").

use std::fmt;
use std::str::FromStr;

/// A non-empty set of CPU numbers, parsed from a list like `0`, `0,2` or `0-3,6`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuSet(Vec<usize>);

/// Why a CPU list did not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("CPU list {list:?}: {why} (expected numbers and ranges like 0,2-3)")]
pub struct CpuSetError {
    list: String,
    why: &'static str,
}

/// The highest CPU number a set may name (`libc::cpu_set_t` holds 1024).
const MAX_CPU: usize = 1023;

impl CpuSet {
    pub fn cpus(&self) -> &[usize] {
        &self.0
    }

    /// Pins the calling thread to this set; threads it starts afterwards inherit it.
    pub fn pin_current_thread(&self) -> std::io::Result<()> {
        // SAFETY: a zeroed cpu_set_t is the empty set; CPU_SET writes within its size (every
        // number is at most MAX_CPU).
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        for &c in &self.0 {
            unsafe { libc::CPU_SET(c, &mut set) };
        }
        set_current(&set)
    }

    /// Runs `f` on the calling thread pinned to this set, then restores the thread's set: for
    /// clients that must be created on the calling thread (not `Send`) and whose threads should
    /// run on these CPUs.
    pub fn run_pinned<T>(&self, f: impl FnOnce() -> T) -> std::io::Result<T> {
        // SAFETY: as above; sched_getaffinity writes at most the size it is given.
        let mut before: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        if unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut before) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        self.pin_current_thread()?;
        let out = f();
        set_current(&before)?;
        Ok(out)
    }
}

/// Sets the calling thread's CPU set (pid 0: the calling thread).
fn set_current(set: &libc::cpu_set_t) -> std::io::Result<()> {
    // SAFETY: `set` is a valid cpu_set_t of the size passed.
    if unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

impl FromStr for CpuSet {
    type Err = CpuSetError;

    fn from_str(list: &str) -> Result<Self, CpuSetError> {
        let err = |why| CpuSetError { list: list.to_string(), why };
        let num = |s: &str| s.trim().parse::<usize>().map_err(|_| err("not a CPU number"));
        let mut cpus = Vec::new();
        for part in list.split(',') {
            let (lo, hi) = match part.split_once('-') {
                Some((a, b)) => (num(a)?, num(b)?),
                None => (num(part)?, num(part)?),
            };
            if lo > hi {
                return Err(err("a range runs backwards"));
            }
            if hi > MAX_CPU {
                return Err(err("a CPU number is above 1023"));
            }
            cpus.extend(lo..=hi);
        }
        cpus.sort_unstable();
        cpus.dedup();
        Ok(Self(cpus))
    }
}

impl fmt::Display for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list: Vec<String> = self.0.iter().map(usize::to_string).collect();
        f.write_str(&list.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_and_ranges_parse_and_bad_ones_say_why() {
        assert_eq!("0".parse::<CpuSet>().unwrap().cpus(), &[0]);
        assert_eq!("3,0-1, 1".parse::<CpuSet>().unwrap().cpus(), &[0, 1, 3]);
        assert_eq!("0-2".parse::<CpuSet>().unwrap().to_string(), "0,1,2");
        for bad in ["", "a", "2-1", "0,", "1024", "-1"] {
            assert!(bad.parse::<CpuSet>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_calling_thread_can_be_pinned_to_a_cpu_it_may_use() {
        // CPU 0 exists wherever this runs; a thread of its own, so the test's runner keeps its set.
        std::thread::spawn(|| "0".parse::<CpuSet>().unwrap().pin_current_thread().unwrap()).join().unwrap();
    }
}
