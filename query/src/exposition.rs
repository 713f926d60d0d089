//! Checks of a `/metrics` exposition against Prometheus' naming conventions
//! (<https://prometheus.io/docs/practices/naming/>), beyond what `promtool check metrics`
//! enforces: the tests of the replica's and the bridge's `/metrics` run both
//! ([`convention_problems`], [`promtool_check`]).
//!
//! - names and label names in snake case; every family has help and a type;
//! - counters, and only counters, end in `_total`;
//! - base units: seconds, not milli/microseconds; Unix times end in `_timestamp_seconds`;
//! - no label value spells a gRPC code in anything but its canonical form (`OK`, `NOT_FOUND`).

use std::collections::BTreeMap;

/// One family of an exposition: its type, help and every sample's label names and values.
#[derive(Debug, Default)]
pub struct Family {
    pub kind: String,
    pub help: String,
    /// (sample name, labels) of each sample.
    pub samples: Vec<(String, BTreeMap<String, String>)>,
}

/// The families of a text exposition, by name.
pub fn parse(text: &str) -> BTreeMap<String, Family> {
    let mut out: BTreeMap<String, Family> = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            out.entry(name.to_string()).or_default().kind = kind.to_string();
        } else if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            out.entry(name.to_string()).or_default().help = help.to_string();
        } else if !line.starts_with('#') && !line.trim().is_empty() {
            let (name, labels) = sample(line);
            let family = family_of(&name, &out);
            out.entry(family).or_default().samples.push((name, labels));
        }
    }
    out
}

/// A sample's name and labels (label values without escapes: ours have none).
fn sample(line: &str) -> (String, BTreeMap<String, String>) {
    let Some((name, rest)) = line.split_once('{') else {
        return (line.split(' ').next().unwrap_or("").to_string(), BTreeMap::new());
    };
    let body = rest.rsplit_once('}').map_or(rest, |(b, _)| b);
    let labels = body
        .split("\",")
        .filter(|kv| !kv.is_empty())
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim_matches('"').to_string()))
        .collect();
    (name.to_string(), labels)
}

/// The family a sample belongs to (a histogram's `_bucket`, `_sum`, `_count` belong to it).
fn family_of(sample: &str, known: &BTreeMap<String, Family>) -> String {
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = sample.strip_suffix(suffix) {
            if known.get(base).is_some_and(|f| f.kind == "histogram" || f.kind == "summary") {
                return base.to_string();
            }
        }
    }
    sample.to_string()
}

fn snake(s: &str) -> bool {
    !s.is_empty()
        && s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && !s.starts_with(|c: char| c.is_ascii_digit())
}

/// What breaks the conventions above, one line per problem (empty: none).
pub fn convention_problems(text: &str) -> Vec<String> {
    let mut problems = Vec::new();
    for (name, f) in parse(text) {
        if !snake(&name) {
            problems.push(format!("{name}: not snake case"));
        }
        if f.kind.is_empty() || f.help.is_empty() {
            problems.push(format!("{name}: no # TYPE or # HELP"));
        }
        if (f.kind == "counter") != name.ends_with("_total") {
            problems.push(format!("{name}: a {} (counters, and only counters, end in _total)", f.kind));
        }
        for unit in ["_ms", "_milliseconds", "_us", "_microseconds", "_millis", "_nanoseconds"] {
            if name.contains(&format!("{unit}_")) || name.ends_with(unit) {
                problems.push(format!("{name}: use seconds, not {unit}"));
            }
        }
        // process_start_time_seconds: the client libraries' standard name, older than the rule.
        let standard = name == "process_start_time_seconds";
        if (name.contains("_time_seconds") || name.contains("_unix"))
            && !name.ends_with("_timestamp_seconds")
            && !standard
        {
            problems.push(format!("{name}: a Unix time ends in _timestamp_seconds"));
        }
        for (_, labels) in &f.samples {
            for (k, v) in labels {
                if !snake(k) {
                    problems.push(format!("{name}: label {k} not snake case"));
                }
                // Canonical names are upper snake case (crate::metrics::code_name).
                if k == "code" && v.chars().any(|c| c.is_ascii_lowercase()) {
                    problems.push(format!("{name}: code=\"{v}\" is not a canonical gRPC code name"));
                }
            }
        }
    }
    problems.sort();
    problems.dedup();
    problems
}

/// `promtool check metrics` on the exposition: `Ok(Some(report))` when it passed, `Ok(None)`
/// when promtool is not installed, `Err(report)` when it failed.
pub fn promtool_check(text: &str) -> Result<Option<String>, String> {
    use std::io::Write;
    let child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn();
    let Ok(mut child) = child else { return Ok(None) };
    let mut stdin = child.stdin.take().expect("piped stdin");
    stdin.write_all(text.as_bytes()).map_err(|e| e.to_string())?;
    drop(stdin);
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    let report = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    if out.status.success() {
        Ok(Some(report))
    } else {
        Err(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_conventions_catch_what_they_say() {
        let good = "# HELP a_total x\n# TYPE a_total counter\na_total{code=\"OK\"} 1\n\
                    # HELP b_seconds x\n# TYPE b_seconds histogram\nb_seconds_bucket{le=\"1\"} 1\n\
                    b_seconds_sum 1\nb_seconds_count 1\n";
        assert_eq!(convention_problems(good), Vec::<String>::new());
        let bad = "# HELP a x\n# TYPE a counter\na{code=\"Ok\"} 1\n# HELP b_total x\n# TYPE b_total gauge\n\
                   b_total 1\n# HELP c_time_seconds x\n# TYPE c_time_seconds gauge\nc_time_seconds 1\n\
                   # HELP d_ms x\n# TYPE d_ms gauge\nd_ms{Shard=\"x\"} 1\n";
        let p = convention_problems(bad);
        assert_eq!(p.len(), 6, "{p:#?}");
    }
}
