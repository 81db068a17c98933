#!/usr/bin/env bash
# Copy a pinned batch's finished records into the checkout's store (docs/reproducing.md).
#
#   benchmarks/batch_sync.sh [--replace] SOURCE_STORE STORE
#
# Copies each record (`<key>.json`, and its `<key>.artifacts.npz`) of SOURCE_STORE that STORE
# lacks; with --replace, also those STORE holds in another version (a profile rerun from an
# empty store at one commit replaces its older records of the same keys). A file being
# written (`*.tmp*`) and the checkpoints of unfinished runs stay behind. Prints how many
# files it copied and how many records STORE holds; it commits nothing.
set -eu
replace=0
if [ "${1:-}" = "--replace" ]; then replace=1; shift; fi
src=$1 dst=$2
copied=0
for f in "$src"/*.json "$src"/*.npz; do
    [ -f "$f" ] || continue
    case $f in *.tmp*) continue ;; esac
    target="$dst/$(basename "$f")"
    if [ ! -e "$target" ] || { [ "$replace" = 1 ] && ! cmp -s "$f" "$target"; }; then
        cp "$f" "$dst/"
        copied=$((copied + 1))
    fi
done
echo "$copied files copied; $(find "$dst" -maxdepth 1 -name '*.json' | wc -l) records in $dst"
