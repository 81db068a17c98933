#!/usr/bin/env bash
# The wall-time log of a long batch that spans sessions (read by benchmarks/batch_wall.py).
#
#   benchmarks/batch_heartbeat.sh PID STORE LOG [NOTE]
#
# While process PID lives, appends a line a minute to LOG: "start", then "beat", then "end",
# each with the UTC time and the number of records in STORE. A pause / resume of the batch
# (benchmarks/batch_pause.sh) adds its own lines. NOTE, if given, goes on the start line.
set -u
pid=$1 store=$2 log=$3 note=${4:-}
now() { date -u +%Y-%m-%dT%H:%M:%SZ; }
records() { find "$store" -maxdepth 1 -name '*.json' 2>/dev/null | wc -l; }
echo "start $(now) records=$(records) pid=$pid${note:+ note: $note}" >> "$log"
while kill -0 "$pid" 2>/dev/null; do
    sleep 60
    kill -0 "$pid" 2>/dev/null && echo "beat $(now) records=$(records)" >> "$log"
done
echo "end $(now) records=$(records)" >> "$log"
