"""Every user error reaches the CLI as one line: `fedtsp: error: ...`, exit 2, no traceback.

One table of bad inputs across `run`, `partition`, `describe` and `reproduce`. Each case
must fail in under 5 s with the offending value or field named, and leave the run store
(a finished record, an interrupted run's checkpoint, a damaged record) byte for byte as it
was.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import CIFAR10_CLASSES, REPO

from fedtsp.cli import _config_from_args as config_from_args
from fedtsp.cli import build_parser, main
from fedtsp.data import load_dataset
from fedtsp.engine.simulation import run_experiment, run_key

SMALL = ["--num-clients", "2", "--alpha", "5", "--batch-size", "4", "--local-epochs", "1"]


def _descriptions(path: Path, classes: list[str], k: int = 3, drop: int = 0, extra: str = ""):
    data: dict = {"_meta": {"k": 3}}  # a file states its k; each class must then have k
    data |= {
        name: {"Short Label": name, "Fine-grained Descriptions": [f"a {name}."] * k}
        for name in classes[drop:]
    }
    if extra:
        data[extra] = {"Short Label": extra, "Fine-grained Descriptions": ["x."] * k}
    path.write_text(json.dumps(data))
    return str(path)


@pytest.fixture(scope="module")
def env(tiny_archive, tmp_path_factory):
    """Bad files, and a run store holding a record, a checkpoint and a damaged record."""
    root = tmp_path_factory.mktemp("bad")
    os.environ["FEDTSP_CACHE"] = str(root / "cache")
    data = str(tiny_archive)
    files = {"data": data}
    full = tiny_archive.read_bytes()
    (root / "truncated.tar.gz").write_bytes(full[: len(full) // 3])
    (root / "corrupt.tar.gz").write_bytes(b"\x1f\x8b" + bytes(range(256)) * 8)
    (root / "empty.tar.gz").write_bytes(b"")
    (root / "nothing").mkdir()
    (root / "a-file").write_text("not a folder\n")
    (root / "bad.json").write_text('{"airplane": {"Short Label": ')
    files["truncated"] = str(root / "truncated.tar.gz")
    files["corrupt"] = str(root / "corrupt.tar.gz")
    files["empty"] = str(root / "empty.tar.gz")
    files["nothing"] = str(root / "nothing")
    files["file"] = str(root / "a-file")
    files["malformed"] = str(root / "bad.json")
    files["incomplete"] = _descriptions(root / "nine.json", CIFAR10_CLASSES, drop=1)
    files["wrong_k"] = _descriptions(root / "k2.json", CIFAR10_CLASSES, k=2)
    files["unknown"] = _descriptions(root / "extra.json", CIFAR10_CLASSES, extra="unicorn")

    store = root / "store"
    files["store"] = str(store)
    dataset = load_dataset("cifar10", data)

    def cfg(algorithm: str, rounds: int):
        args = ["run", "--data", data, *SMALL, "--algorithm", algorithm, "--rounds", str(rounds)]
        return config_from_args(build_parser().parse_args(args))

    run_experiment(cfg("local", 1), dataset=dataset, out=store, progress=False)
    # An interrupted run (its checkpoint stays), and the checkpoints of two more runs: one
    # that belongs to another run, one damaged.
    run_experiment(cfg("fedproto", 2), dataset=dataset, out=store, progress=False, stop_after=1)
    ckpts = store / "checkpoints"
    (ckpt,) = ckpts.glob("*.pt")
    torch.save({"key": "0123456789abcdef"}, ckpts / f"{run_key(cfg('fml', 2), dataset)}.pt")
    (ckpts / f"{run_key(cfg('fedgh', 2), dataset)}.pt").write_bytes(ckpt.read_bytes()[:100])
    (store / f"{run_key(cfg('lg-fedavg', 1), dataset)}.json").write_text('{"key": "trunc')
    yield files
    os.environ.pop("FEDTSP_CACHE", None)


def _run(*args: str) -> list[str]:
    return ["run", "--data", "{data}", *SMALL, "--rounds", "1", "--out", "{store}", *args]


# (argv with {placeholders} from `env`, text that the error line must contain)
CASES = [
    # run: flags and config values
    (["run", "--dataset", "imagenet"], "--dataset imagenet"),
    (["run", "--alpha", "abc"], "--alpha"),
    (["run", "--alpha", "-1"], "--alpha -1.0"),
    (["run", "--num-clients", "0"], "--num-clients 0"),
    (["run", "--fraction", "1.5"], "--fraction 1.5"),
    (["run", "--family", "htfe7"], "'htfe7'"),
    (["run", "--algorithm", "fedfoo"], "--algorithm fedfoo"),
    (["run", "--rounds", "0"], "--rounds 0"),
    (["run", "--local-epochs", "0"], "--local-epochs 0"),
    (["run", "--lr", "0"], "--lr 0.0"),
    (["run", "--lr", "inf"], "--lr inf"),
    (["run", "--family", "homo-nosuch"], "'homo-nosuch'"),
    (["run", "--batch-size", "0"], "--batch-size 0"),
    (["run", "--device", "tpu"], "--device tpu"),
    (["run", "--precision", "fp8"], "--precision fp8"),
    (["run", "--layout", "weird"], "--layout"),
    (["run", "--setting", "foo"], "--setting foo"),
    (["run", "--batch-order", "random"], "'random'"),
    (["run", "--client-init", "zero"], "'zero'"),
    (["run", "--undersized-clients", "drop"], "'drop'"),
    (["run", "--checkpoint-every", "0"], "--checkpoint-every 0"),
    (["run", "--algorithm", "fedproto", "--lam", "-1"], "--lam -1.0"),
    (["run", "--algorithm", "local", "--lam", "1"], "lam"),
    (["run", "--algorithm", "fedtsp", "--dp-epsilon", "-1"], "--dp-epsilon -1.0"),
    (["run", "--algorithm", "fedtsp", "--text-encoder", "gpt"], "--text-encoder gpt"),
    (["run", "--unknown-flag"], "--unknown-flag"),
    (["run", "--preset", "FedAvg", "--setting", "pfl"], "not pfl"),
    (["run", "--resume", "--force"], "--resume"),
    (["run", "--round-timeout", "10"], "--engine flower"),
    (["run", "--workdir", "{nothing}"], "--workdir"),
    # run: data paths and archives
    (["run", "--data", "/no/such/archive.tar.gz"], "/no/such/archive.tar.gz"),
    (["run", "--data", "{truncated}", "--out", "{store}", *SMALL], "truncated.tar.gz"),
    (["run", "--data", "{corrupt}", "--out", "{store}", *SMALL], "corrupt.tar.gz"),
    (["run", "--data", "{empty}", "--out", "{store}", *SMALL], "empty.tar.gz"),
    (["run", "--data", "{nothing}", "--out", "{store}", *SMALL], "nothing"),
    (["run", "--data", "{data}", "--num-clients", "500"], "500"),
    # run: description files
    (_run("--algorithm", "fedtsp", "--description-set", "/no/such.json"), "/no/such.json"),
    (_run("--algorithm", "fedtsp", "--description-set", "{malformed}"), "bad.json"),
    (_run("--algorithm", "fedtsp", "--description-set", "{incomplete}"), "airplane"),
    (_run("--algorithm", "fedtsp", "--description-set", "{wrong_k}"), "k2.json"),
    (_run("--algorithm", "fedtsp", "--description-set", "{unknown}"), "unicorn"),
    # run: options that only the run's config can judge, before any data loads
    (_run("--algorithm", "fedtsp", "--dp-epsilon", "8", "--dp-client", "9"), "--dp-client 9"),
    (_run("--algorithm", "fedtsp", "--feature-dim", "7"), "--feature-dim 7"),
    # run: model weights that cannot be had offline
    (_run("--algorithm", "fedtsp", "--text-encoder", "clip-vit-b-32"), "ViT-B-32"),
    (_run("--algorithm", "fedtsp", "--text-encoder", "bert-base-uncased"), "bert-base-uncased"),
    # run: client processes
    (_run("--client-workers", "0"), "--client-workers 0"),
    (_run("--engine", "flower-sim", "--client-workers", "2"), "--client-workers"),
    # run: output folders, run stores and checkpoints
    (["run", "--out", "{file}"], "a-file"),
    (_run("--algorithm", "fedproto", "--rounds", "2"), "--resume"),
    (_run("--algorithm", "fml", "--rounds", "2", "--resume"), "0123456789abcdef"),
    (_run("--algorithm", "fedgh", "--rounds", "2", "--resume"), "unreadable"),
    (_run("--algorithm", "lg-fedavg"), "unreadable"),
    # partition
    (["partition", "--export", "{file}"], "a-file"),
    (["partition", "--alpha", "0", "--export", "{nothing}"], "--alpha 0.0"),
    (["partition", "--data", "/no/such/dir", "--export", "{nothing}"], "/no/such/dir"),
    (["partition", "--data", "{truncated}", "--export", "{nothing}"], "truncated.tar.gz"),
    (["partition"], "--export"),
    (["partition", "--population", "label-groups", "--export", "{nothing}"], "--population"),
    # describe
    (["describe", "--dataset", "nosuch", "--model", "m"], "'nosuch'"),
    (["describe", "--dataset", "cifar10", "--model", "m", "--k", "0"], "got 0"),
    (["describe", "--dataset", "cifar10", "--model", "m", "--variant", "huge"], "'huge'"),
    (["describe", "--dataset", "cifar10", "--model", "m", "--timeout", "-1"], "-1.0"),
    (["describe", "--dataset", "cifar10", "--provider", "local", "--model", "/no/m"], "/no/m"),
    (["describe", "--dataset", "cifar10", "--model", "gpt-4o"], "OPENAI_API_KEY"),
    (["describe", "--dataset", "cifar10", "--model", "m", "--temperature", "-1"], "-1.0"),
    (
        [
            "describe",
            "--dataset",
            "cifar10",
            "--provider",
            "local",
            "--model",
            "m",
            "--device",
            "tpu",
        ],
        "'tpu'",
    ),
    # reproduce
    (["reproduce", "--profile", "nosuch"], "'nosuch'"),
    (["reproduce", "--only", "99"], "99"),
    (["reproduce", "--workers", "0"], "--workers 0"),
    (["reproduce", "--results", "{file}"], "a-file"),
    (["reproduce", "--only", "01", "--prune"], "--prune needs every notebook"),
    (["reproduce", "--plan", "--prune"], "--prune"),
    (["reproduce", "--plan", "--papermill-dir", "{nothing}"], "--papermill-dir"),
    # verify and claims (nothing reruns: each fails on its flags)
    (["verify", "--sample-seed", "3"], "--sample N"),
    (["verify", "--sample", "1", "--report", "{nothing}"], "nothing"),
    (["verify", "--sample", "1", "--report", "{file}/x.md"], "a-file"),
    (["claims", "--against", "cpu"], "--against cpu"),
    (["claims", "NOPE"], "NOPE"),
    (["claims", "--results", "{nothing}/results"], "give --results"),
]


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_the_table_is_large_and_spans_every_command():
    assert len(CASES) >= 30
    commands = {"run", "partition", "describe", "reproduce", "verify", "claims"}
    assert {argv[0] for argv, _ in CASES} == commands


@pytest.mark.parametrize(
    ("argv", "named"), CASES, ids=[f"{i:02d}-{a[0]}-{n}" for i, (a, n) in enumerate(CASES)]
)
def test_bad_input_is_one_line_exit_2(env, argv, named, capsys, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "")
    # Weights that are not on this machine must not be fetched (and the test must not wait
    # on a network that may be absent).
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True, raising=False)
    store = Path(env["store"])
    before = _snapshot(store)
    args = [a.format(**env) for a in argv]
    if args[0] in ("run", "describe"):
        args.append("--no-progress")
    start = time.perf_counter()
    try:
        code = main(args)
    except SystemExit as exc:  # argparse usage errors exit from inside parse_args
        code = exc.code
    seconds = time.perf_counter() - start
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert "Traceback" not in out + err
    assert lines and lines[-1].startswith("fedtsp: error: "), err
    assert len([line for line in lines if line.startswith("fedtsp: error:")]) == 1
    assert any(alt in lines[-1] for alt in named.split("|")), lines[-1]
    assert seconds < 5, f"{seconds:.1f} s"
    assert _snapshot(store) == before  # nothing in the store was touched


def test_console_script_hides_the_traceback_unless_debug(env, tmp_path):
    """The real entry point, in a fresh process: one line; --debug / FEDTSP_DEBUG show frames."""
    argv = [sys.executable, "-m", "fedtsp", "partition", "--data", env["truncated"]]
    argv += ["--export", str(tmp_path / "x")]
    clean = {k: v for k, v in os.environ.items() if k != "FEDTSP_DEBUG"}
    plain = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env=clean, timeout=120)
    assert plain.returncode == 2
    assert plain.stderr.strip().splitlines() == [plain.stderr.strip()]
    assert plain.stderr.startswith("fedtsp: error: ") and "truncated.tar.gz" in plain.stderr
    debug = subprocess.run(
        [*argv, "--debug"], capture_output=True, text=True, cwd=REPO, env=clean, timeout=120
    )
    assert debug.returncode != 0 and "Traceback" in debug.stderr
    env_debug = subprocess.run(
        argv, capture_output=True, text=True, cwd=REPO, env={**clean, "FEDTSP_DEBUG": "1"}
    )
    assert "Traceback" in env_debug.stderr and "DatasetFormatError" in env_debug.stderr


def test_a_rerun_after_the_errors_still_resumes_the_interrupted_run(env, capsys):
    """The interrupted run's checkpoint survived every bad input: --resume finishes it."""
    args = [a.format(**env) for a in _run("--algorithm", "fedproto", "--rounds", "2", "--json")]
    assert main([*args, "--resume", "--no-progress"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["evaluations"] == 3 and not summary["cache_hit"]
    assert not (Path(env["store"]) / "checkpoints" / f"{summary['key']}.pt").exists()


@pytest.mark.parametrize(("file", "named"), [("malformed", "bad.json"), ("incomplete", "airplane")])
def test_a_description_file_is_checked_with_the_config_before_any_data_loads(env, file, named):
    """`check_run`, which loads no data, already rejects the file (its prompt lengths wait for
    the text encoder); a file with every class passes it."""
    from fedtsp.core.config import ConfigError
    from fedtsp.engine.runspec import check_run

    def config(path: str):
        args = [a.format(**env) for a in _run("--algorithm", "fedtsp", "--description-set", path)]
        return config_from_args(build_parser().parse_args(args))

    with pytest.raises(ConfigError, match=named):
        check_run(config(env[file]))
    check_run(config("cifar10_long"))
