# The README's two commands. Both install missing system packages first.
.PHONY: demo test bench-peers
demo:
	bash scripts/demo.sh
test:
	bash scripts/test.sh
# Peer comparison (compiles smg-radix-tree and dynamo-kv-router in their own workspace).
bench-peers:
	bash scripts/bench-peers.sh
