#!/usr/bin/env bash
# Start (or, in a later session, restart) a long batch from a worktree pinned at one commit,
# with its heartbeat log (docs/reproducing.md, "A batch across sessions").
#
#   benchmarks/batch_start.sh WORKTREE COMMIT PROFILE LOG
#
# Creates WORKTREE at COMMIT if it is missing and puts the checkout's store of PROFILE in place
# of the one committed at COMMIT (the batch resumes from what is stored there; records the
# checkout has since removed must not come back); refuses a WORKTREE at another commit.
# The batch runs `fedtsp reproduce --profile PROFILE` with the worktree's own code and this
# checkout's virtual environment, one thread per process, a line per finished run in
# WORKTREE/batch.log;
# the heartbeat appends to LOG. Prints the batch's PID (for batch_pause.sh).
set -eu
worktree=$1 commit=$2 profile=$3 log=$4
repo=$(pwd)
store=results/$profile/runs
if [ ! -d "$worktree" ]; then
    git worktree add --detach "$worktree" "$commit" > /dev/null
    rm -rf "${worktree:?}/$store"
    mkdir -p "$worktree/results/$profile"
    [ -d "$store" ] && cp -a "$store" "$worktree/results/$profile/"
fi
head=$(git -C "$worktree" rev-parse HEAD)
if [ "$head" != "$(git rev-parse "$commit^{commit}")" ]; then
    echo "$worktree is at ${head:0:7}, not at $commit: a batch keeps one code version" >&2
    exit 2
fi
if pgrep -f "fedtsp.cli reproduce --profile $profile" > /dev/null; then
    echo "a batch of profile $profile is already running" >&2
    exit 2
fi
cd "$worktree"  # a background job, not a subshell's: the script returns at once
PYTHONPATH=. setsid nohup env OMP_NUM_THREADS=1 "$repo/.venv/bin/python" \
    -m fedtsp.cli reproduce --profile "$profile" --no-progress > batch.log 2>&1 < /dev/null &
cd "$repo"
sleep 3
pid=$(pgrep -f "fedtsp.cli reproduce --profile $profile" | head -1)
setsid nohup "$repo/benchmarks/batch_heartbeat.sh" "$pid" "$worktree/$store" "$log" \
    "${commit:0:7}" > /dev/null 2>&1 < /dev/null &
echo "$pid"
