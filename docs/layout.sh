#!/usr/bin/env bash
# Writes the module lists of docs/layout.md from the source: each crate's files with the first
# sentence of their `//!` comment, so that the lists cannot drift from the code.
#
# Usage: docs/layout.sh            rewrites the lists in docs/layout.md
#        docs/layout.sh --check    exits 1, showing the difference, if they are out of date
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
doc=$root/docs/layout.md
begin='<!-- modules: written by docs/layout.sh from the source; do not edit by hand -->'
end='<!-- end of modules -->'

# The crates in the order of their floors, lowest first.
crates=(proto client etcd runtime http server sidecar sim tests fuzz)

lists() {
  for crate in "${crates[@]}"; do
    dir=$root/$crate
    name=$(sed -n 's/^name = "\(.*\)"/\1/p' "$dir/Cargo.toml" | head -n 1)
    printf '\n### `%s/` — %s\n\n' "$crate" "$name"
    (cd "$dir" && git ls-files -- '*.rs' | grep -Ev '(^|/)tests?\.rs$|^tests/|^benches/' | LC_ALL=C sort) |
      while read -r file; do
        # The first paragraph of the file's doc comment, up to its first full stop.
        sentence=$(awk '/^\/\/!/ { sub(/^\/\/! ?/, ""); if ($0 == "") exit; printf "%s ", $0; next } { exit }' \
          "$dir/$file" | sed -e 's/ *$//' -e 's/\(\.\) .*/\1/')
        printf -- '- `%s`: %s\n' "$file" "${sentence:-(no doc comment)}"
      done
  done
}

generated=$(mktemp)
trap 'rm -f "$generated"' EXIT
{
  awk -v begin="$begin" '{ print } $0 == begin { exit }' "$doc"
  lists
  printf '\n%s\n' "$end"
  awk -v end="$end" 'after { print } $0 == end { after = 1 }' "$doc"
} >"$generated"

if [ "${1:-}" = "--check" ]; then
  if ! diff -u "$doc" "$generated"; then
    echo "docs/layout.md is out of date with the source: run docs/layout.sh" >&2
    exit 1
  fi
else
  cp "$generated" "$doc"
fi
