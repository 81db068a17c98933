#!/usr/bin/env bash
# One fedtsp experiment on Flower as separate processes on this machine: a SuperLink and one
# SuperNode per client (each handed only its own node-<i>.npz), then `flwr run`.
# On real machines run the same flower-superlink / flower-supernode lines on each host,
# with --superlink <server-host>:PORT and the node's own data file.
#
#   scripts/flower_local.sh WORKDIR [fedtsp run flags...]
#   e.g. scripts/flower_local.sh /tmp/fl --dataset cifar10 --data ../shared/data/cifar10-jpg.tar.gz \
#        --num-clients 3 --alpha 0.1 --fraction 0.05 --family htfe-cpu --algorithm fedtsp --rounds 5 --out runs
set -euo pipefail
WORK=$(mkdir -p "$1" && cd "$1" && pwd); shift
PORT=${FLOWER_PORT:-9092}
export FLWR_TELEMETRY_ENABLED=0 FLWR_HOME="$WORK/flwr-home"
mkdir -p "$WORK/logs"
pids=()
cleanup() { for p in "${pids[@]}"; do kill -- -"$p" 2>/dev/null || true; done; }
trap cleanup EXIT INT TERM

# 1. partition once; write run.json, server.npz, node-<i>.npz, the Flower App and FLWR_HOME
N=$(python -m fedtsp.engine.flower prepare --workdir "$WORK" --superlink-port "$PORT" "$@" | tail -n 1)

# 2. the SuperLink (runs the ServerApp; no dependency installation: the app is fedtsp itself)
setsid flower-superlink --insecure --disable-runtime-dependency-installation \
    --host 127.0.0.1 --port "$PORT" >"$WORK/logs/superlink.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/"$PORT") 2>/dev/null && break; sleep 0.2; done

# 3. one SuperNode per client, each with its partition
for ((i = 0; i < N; i++)); do
    setsid flower-supernode --insecure --superlink 127.0.0.1:"$PORT" \
        --host 127.0.0.1 --port $((PORT + 10 + i)) \
        --node-config "partition-id=$i data-file=\"$WORK/node-$i.npz\"" \
        >"$WORK/logs/supernode-$i.log" 2>&1 &
    pids+=($!)
done

# 4. submit the app; --stream follows the ServerApp's log until the run ends
flwr run "$WORK/app" --stream | grep -v "HTTP Request" | tee "$WORK/logs/flwr-run.log" || true
python -m fedtsp.engine.flower result --workdir "$WORK"
