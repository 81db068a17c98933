"""Helpers for running the Flower processes by hand (used by scripts/flower_local.sh).

python -m fedtsp.engine.flower prepare --workdir W --superlink-port P [fedtsp run flags]
    writes W/run.json, W/server.npz, W/node-<i>.npz, the Flower App W/app and a
    FLWR_HOME W/flwr-home pointing `flwr run` at 127.0.0.1:P; prints the client count
python -m fedtsp.engine.flower result --workdir W
    prints the run's summary once the ServerApp has written its record (exit 1 on failure)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from fedtsp.core.config import FAILURE_POLICIES, ROUND_TIMEOUT


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fedtsp.engine.flower")
    parser.add_argument("action", choices=("prepare", "result"))
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--superlink-port", type=int, default=9092)
    parser.add_argument(
        "--on-client-failure", choices=FAILURE_POLICIES, default=FAILURE_POLICIES[0]
    )
    parser.add_argument("--round-timeout", type=float, default=ROUND_TIMEOUT)
    args, rest = parser.parse_known_args(argv)

    from fedtsp.engine.flower.launch import _outcome, write_app
    from fedtsp.engine.flower.workdir import ClientFailureError, prepare_workdir

    workdir = Path(args.workdir).resolve()
    if args.action == "result":
        try:
            record = _outcome(workdir)
        except ClientFailureError as exc:
            print(f"fedtsp: error: {exc}", file=sys.stderr)
            return 1
        print(json.dumps({"key": record["key"], "status": record["status"], **record["summary"]}))
        return 0

    from fedtsp.cli import _config_from_args, build_parser
    from fedtsp.data import load_dataset
    from fedtsp.engine.runspec import check_run

    run_args = build_parser().parse_args(["run", *rest])
    config = check_run(_config_from_args(run_args))
    dataset = load_dataset(config.dataset, run_args.data)
    prepare_workdir(
        config,
        dataset,
        workdir,
        out=run_args.out,
        engine="flower-processes",
        on_failure=args.on_client_failure,
        round_timeout=args.round_timeout,
    )
    write_app(workdir, args.superlink_port)
    print(config.num_clients)
    return 0


if __name__ == "__main__":
    sys.exit(main())
