# Sourced by the other scripts: one place for the build environment.
# The target dir lives outside the clone so every clone and CI run on a machine reuses the
# (slow: ~15 min on 2 cores) RocksDB + librdkafka build.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/prefixlog/target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
PREFIXLOG_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PREFIXLOG_ROOT
# The bundled Mooncake trace (data/mooncake, Apache-2.0), overridable.
export PREFIXLOG_TRACE="${PREFIXLOG_TRACE:-$PREFIXLOG_ROOT/data/mooncake/conversation_trace.jsonl}"
