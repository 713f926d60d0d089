# The README's two commands. Both install missing system packages first.
.PHONY: demo test bench-peers bench-engine
demo:
	bash scripts/demo.sh
test:
	bash scripts/test.sh
# Peer comparison (compiles smg-radix-tree and dynamo-kv-router in their own workspace).
bench-peers:
	bash scripts/bench-peers.sh
# Engine benchmark (single thread and writer + concurrent reader) on the bundled trace;
# ARGS=... passes flags on (e.g. ARGS=--query-copy).
bench-engine:
	bash -c 'source scripts/env.sh && cd "$$PREFIXLOG_ROOT" && bash scripts/ensure-deps.sh && cargo run --release -p prefixlog-engine --example engine-bench -- --trace "$$PREFIXLOG_TRACE" $(ARGS)'
