#!/usr/bin/env bash
# Proves the repository is self-contained (issue 17): copies the tracked files alone into an
# otherwise empty folder ($TMPDIR/prefixlog-self-contained/repo: no siblings, so a path into a
# sibling folder of the clone cannot resolve) and runs the demo smoke test there, which runs
# `prefixlog-lab demo` on its default, bundled trace. The folder is fixed and modification times are kept, so later
# runs rebuild only what changed; the Cargo target dir is the usual one (scripts/env.sh).
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$PREFIXLOG_ROOT"
echo "==> no tracked file names a path outside the clone"
# A path up into a sibling folder, or an absolute path of some machine's home or work tree.
# (The pattern is assembled so that this file does not name such a path itself.)
SIBLING='\.\./'"sha"'red'
if git grep -nE "$SIBLING|/work/|/root/|/home/[a-z]" -- . ':!CHANGELOG.md' ':!scripts/check-self-contained.sh'; then
  echo "error: the files above name paths outside the repository" >&2
  exit 1
fi
base="${TMPDIR:-/tmp}/prefixlog-self-contained"
rm -rf "$base"
mkdir -p "$base/repo"
git ls-files -z | xargs -0 cp -p --parents -t "$base/repo"
echo "==> $(git ls-files | wc -l) tracked files copied to $base/repo (nothing else in $base)"
cd "$base/repo"
# A fresh environment: nothing from this clone's env.sh may leak into the copy.
env -u PREFIXLOG_ROOT -u PREFIXLOG_TRACE PREFIXLOG_TEST_BACKENDS=embedded \
  bash -c 'source scripts/env.sh && cargo test -p prefixlog-lab --test demo_smoke -- --nocapture'
rm -rf "$base"
