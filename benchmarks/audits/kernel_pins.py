"""Which kernel settings rerun a stored record bit for bit on this machine.

    python benchmarks/audits/kernel_pins.py [--key a3068af8a0d2d3d4] [--profile evidence]

Reruns one record of a committed store, from scratch with one thread, once per kernel
setting: none (this machine's own kernels), each of ``ATEN_CPU_CAPABILITY=avx2``,
``ONEDNN_MAX_CPU_ISA=AVX2`` and ``MKL_CBWR=AVX2`` alone, the first two together, and all three
(the pins `import fedtsp` sets, fedtsp.core.isa). Each rerun is a fresh process started with
``FEDTSP_ISA=native`` and the setting, so the variables act when torch loads and fedtsp adds
nothing. Each row: PyTorch's effective kernel level and the rerun against the record
(identical, or the largest difference per metric and the first round where they part).
NumPy's and OpenBLAS's levels are held at the pins in every row (they are not PyTorch's).
Run on machines of both vendors, it says which settings carry a record across them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: shared helpers

from facts import machine_facts, write_result

from fedtsp.core import isa
from fedtsp.core.machine import cpu_class
from fedtsp.core.paths import REPO_ROOT
from fedtsp.core.results import code_version

RESULTS = REPO_ROOT / "benchmarks" / "results"
ATEN, ONEDNN, MKL = "ATEN_CPU_CAPABILITY=avx2", "ONEDNN_MAX_CPU_ISA=AVX2", "MKL_CBWR=AVX2"
SETTINGS = ([], [ATEN], [ONEDNN], [MKL], [ATEN, ONEDNN], [ATEN, ONEDNN, MKL])
# What one rerun does, in its own process (fedtsp imported first, at FEDTSP_ISA=native).
RERUN = """
import json, sys, tempfile
import fedtsp
import torch
from fedtsp.core.config import RunConfig
from fedtsp.paper.experiments import DataSource, RunSpec, run_all
from fedtsp.paper.profiles import load_profile
from fedtsp.paper.verify import compare_histories

record = json.load(open(sys.argv[1]))
profile = load_profile(sys.argv[2])
torch.set_num_threads(1)
source = DataSource(profile.data, profile.synthetic_per_class)
with tempfile.TemporaryDirectory() as tmp:
    spec = RunSpec(RunConfig.from_dict(record["config"]))
    new = run_all([spec], source, tmp, progress=False)[0]
diff, first = compare_histories(record["history"], new["history"])
aten = str(torch.backends.cpu.get_cpu_capability())
print(json.dumps({"aten": aten, "differences": diff, "first_round": first}))
"""


def rerun(record_file: Path, profile: str, setting: list[str]) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in isa.KERNEL_PINS}
    env |= {isa.CHOICE: "native", "OMP_NUM_THREADS": "1"}
    env |= dict(s.split("=") for s in setting)
    argv = [sys.executable, "-c", RERUN, str(record_file), profile]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True, cwd=REPO_ROOT)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--key", default="a3068af8a0d2d3d4", help="the record to rerun")
    parser.add_argument("--profile", default="evidence", help="whose store holds it")
    parser.add_argument("--out", default=str(RESULTS / "kernel_pins.json"))
    args = parser.parse_args()
    code = code_version()
    record_file = REPO_ROOT / "results" / args.profile / "runs" / f"{args.key}.json"
    record = json.loads(record_file.read_text())
    made = record["environment"].get("cpu") or {}
    rows = []
    for setting in SETTINGS:
        rows.append({"setting": setting, **rerun(record_file, args.profile, setting)})
        print(json.dumps(rows[-1]), flush=True)
    here = cpu_class()
    config = record["config"]
    lines = [
        f"Record {args.key} ({config['algorithm']} on {config.get('population') or config['dataset']}, "
        f"seed {config['seed']}; made on {isa.cpu_words(made)}, {record['environment'].get('threads')} "
        f"thread), rerun from scratch on this machine ({isa.cpu_words(here)}) with one thread, once per kernel "
        "setting, each in a fresh process",
        "",
        "| setting | PyTorch kernels | rerun against the record |",
        "| --- | --- | --- |",
    ]
    for row in rows:
        if row["differences"]:
            worst = ", ".join(f"{m} {d:.4g}" for m, d in sorted(row["differences"].items()))
            result = f"differs from round {row['first_round']} ({worst})"
        else:
            result = f"**identical** ({len(record['history'])} evaluations)"
        setting = " + ".join(f"`{s}`" for s in row["setting"]) or "none (this machine's own)"
        lines.append(f"| {setting} | {row['aten']} | {result} |")
    payload = {
        "setting": {"key": args.key, "profile": args.profile, "made_on": made},
        "rows": rows,
        "machine": machine_facts() | {"class": here},
    }
    write_result(Path(args.out), payload, "\n".join(lines), code)
    print(Path(args.out).with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
