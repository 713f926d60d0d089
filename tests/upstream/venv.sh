#!/usr/bin/env bash
# Prepares the upstream leg's Python once per machine and prints its interpreter's path.
#
#   ~/.cache/prefixlog/upstream/venv-<hash>/   the peers' releases and the leg's tools (pins.txt)
#   ~/.cache/prefixlog/upstream/wheels/        wheels downloaded with --no-deps (cached)
#   ~/.cache/prefixlog/upstream/src/<pkg>-<v>/ the `# source` wheels' .py files, unpacked
#
# <hash> is the sha256 of pins.txt, so a changed pin builds a new venv and an unchanged one
# costs nothing. Everything comes from the package registry; nothing else is needed.
# PREFIXLOG_UPSTREAM_CACHE overrides the cache directory.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
pins="$here/pins.txt"
cache="${PREFIXLOG_UPSTREAM_CACHE:-$HOME/.cache/prefixlog/upstream}"
key="$(sha256sum "$pins" | cut -c1-16)"
venv="$cache/venv-$key"
mkdir -p "$cache/wheels" "$cache/src"
if [ ! -f "$venv/.ready" ]; then
  echo "==> upstream venv: $venv (from $pins)" >&2
  rm -rf "$venv"
  python3 -m venv "$venv"
  reqs="$(mktemp)"
  grep -v '# source' "$pins" | sed 's/#.*//' | grep -v '^[[:space:]]*$' >"$reqs"
  "$venv/bin/pip" install -q --disable-pip-version-check -r "$reqs" >&2
  rm -f "$reqs"
  touch "$venv/.ready"
fi
# The source wheels: downloaded once, their .py files unpacked once per version.
grep '# source' "$pins" | sed 's/#.*//' | while read -r req; do
  [ -n "$req" ] || continue
  name="${req%%==*}"; version="${req##*==}"
  dest="$cache/src/$name-$version"
  [ -f "$dest/.ready" ] && continue
  echo "==> upstream source: $req (wheel, --no-deps, .py files only)" >&2
  ls "$cache/wheels/${name//-/_}-$version-"*.whl >/dev/null 2>&1 \
    || "$venv/bin/pip" download -q --disable-pip-version-check --no-deps -d "$cache/wheels" "$req" >&2
  rm -rf "$dest"; mkdir -p "$dest"
  "$venv/bin/python" - "$cache/wheels" "$name" "$version" "$dest" <<'PY'
import glob, sys, zipfile
wheels, name, version, dest = sys.argv[1:]
(wheel,) = glob.glob(f"{wheels}/{name.replace('-', '_')}-{version}-*.whl")
with zipfile.ZipFile(wheel) as z:
    z.extractall(dest, [n for n in z.namelist() if n.endswith((".py", ".proto")) or n.endswith("METADATA")])
PY
  touch "$dest/.ready"
done
echo "$venv/bin/python"
