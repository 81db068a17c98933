#!/usr/bin/env bash
# Pause or resume a running batch (its whole process group) so that a measurement in the
# foreground has the machine to itself; or lower it to the lowest priority while heavy
# foreground work (a CI run) shares the machine, and raise it back. Each is logged, so that
# a pause is not counted as work and shared time is reported as such.
#
#   benchmarks/batch_pause.sh stop|cont|share|alone PID LOG
set -eu
action=$1 pid=$2 log=$3
now() { date -u +%Y-%m-%dT%H:%M:%SZ; }
pgid=$(ps -o pgid= -p "$pid" | tr -d ' ')
members() { ps -eo pid=,pgid= | awk -v g="$pgid" '$2 == g {print $1}'; }
# With the kernel's autogroup scheduling (sched_autogroup_enabled), a process's nice value only
# ranks it within its session's group, and groups share the CPU equally: the batch (its own
# session, from setsid) is lowered as a group too.
autogroup() {
    if [ -w "/proc/$pid/autogroup" ]; then echo "$1" > "/proc/$pid/autogroup"; fi
}
case $action in
    stop) kill -STOP -- "-$pgid" && echo "pause $(now)" >> "$log" ;;
    cont) kill -CONT -- "-$pgid" && echo "resume $(now)" >> "$log" ;;
    share) renice -n 19 $(members) > /dev/null && autogroup 19 && echo "shared $(now)" >> "$log" ;;
    alone) renice -n 0 $(members) > /dev/null && autogroup 0 && echo "alone $(now)" >> "$log" ;;
    *) echo "usage: $0 stop|cont|share|alone PID LOG" >&2; exit 2 ;;
esac
