#!/usr/bin/env bash
# Start (or, in a later session, restart) a long batch from a worktree pinned at one commit,
# with its heartbeat log (docs/reproducing.md, "A batch across sessions").
#
#   benchmarks/batch_start.sh WORKTREE COMMIT PROFILE LOG
#
# Creates WORKTREE at COMMIT if it is missing and puts in place of the store of PROFILE committed
# at COMMIT the checkout's records made by COMMIT (the batch resumes from what is stored there:
# records the checkout has since removed must not come back, and records of another code
# version must not count as done); refuses a WORKTREE at another commit.
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
    mkdir -p "$worktree/$store"
    full=$(git rev-parse "$commit^{commit}")
    for record in "$store"/*.json; do
        [ -f "$record" ] && grep -q "\"git_commit\": \"$full\"" "$record" || continue
        cp -p "$record" "$worktree/$store/"
        artifacts=${record%.json}.artifacts.npz
        if [ -f "$artifacts" ]; then cp -p "$artifacts" "$worktree/$store/"; fi
    done
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
# An absolute PYTHONPATH: the notebooks' kernels start in notebooks/, where "." would miss the
# worktree's code and import this checkout's (its editable install) instead.
PYTHONPATH="$PWD" setsid nohup env OMP_NUM_THREADS=1 "$repo/.venv/bin/python" \
    -m fedtsp.cli reproduce --profile "$profile" --no-progress > batch.log 2>&1 < /dev/null &
cd "$repo"
sleep 3
pid=$(pgrep -f "fedtsp.cli reproduce --profile $profile" | head -1)
setsid nohup "$repo/benchmarks/batch_heartbeat.sh" "$pid" "$worktree/$store" "$log" \
    "${commit:0:7}" > /dev/null 2>&1 < /dev/null &
echo "$pid"
