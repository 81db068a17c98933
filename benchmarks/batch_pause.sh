#!/usr/bin/env bash
# Pause or resume a running batch (its whole process group) so that a measurement in the
# foreground has the machine to itself; the pause is logged so it is not counted as work.
#
#   benchmarks/batch_pause.sh stop|cont PID LOG
set -eu
action=$1 pid=$2 log=$3
now() { date -u +%Y-%m-%dT%H:%M:%SZ; }
pgid=$(ps -o pgid= -p "$pid" | tr -d ' ')
case $action in
    stop) kill -STOP -- "-$pgid" && echo "pause $(now)" >> "$log" ;;
    cont) kill -CONT -- "-$pgid" && echo "resume $(now)" >> "$log" ;;
    *) echo "usage: $0 stop|cont PID LOG" >&2; exit 2 ;;
esac
