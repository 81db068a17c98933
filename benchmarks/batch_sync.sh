#!/usr/bin/env bash
# Copy a pinned batch's finished records into the checkout's store (docs/reproducing.md).
#
#   benchmarks/batch_sync.sh SOURCE_STORE STORE
#
# Copies each record (`<key>.json`, and its `<key>.artifacts.npz`) of SOURCE_STORE that STORE
# lacks; a file being written (`*.tmp*`) and the checkpoints of unfinished runs stay behind.
# Prints how many files it copied and how many records STORE holds; it commits nothing.
set -eu
src=$1 dst=$2
copied=0
for f in "$src"/*.json "$src"/*.npz; do
    [ -f "$f" ] || continue
    case $f in *.tmp*) continue ;; esac
    if [ ! -e "$dst/$(basename "$f")" ]; then
        cp "$f" "$dst/"
        copied=$((copied + 1))
    fi
done
echo "$copied files copied; $(find "$dst" -maxdepth 1 -name '*.json' | wc -l) records in $dst"
