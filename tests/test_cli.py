"""The command line: help lists the catalogue; bad values fail fast with one sentence."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from conftest import REPO

from fedtsp.cli import main


def _run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fedtsp", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )


def test_help_lists_datasets_families_algorithms():
    result = _run_cli("run", "--help")
    assert result.returncode == 0
    for word in ("cifar10", "cifar100", "tinyimagenet", "fmnist", "htfe9", "htfe-cpu"):
        assert word in result.stdout
    for word in ("local", "fedproto", "fedtsp", "--resume", "--algorithm NAME --help"):
        assert word in result.stdout
    assert "--prompt-tokens" not in result.stdout  # a method's options: with its --algorithm


def test_run_help_with_an_algorithm_lists_that_methods_options_only():
    result = _run_cli("run", "--algorithm", "fedtsp", "--help")
    assert result.returncode == 0
    assert "options of --algorithm fedtsp" in result.stdout
    assert "--prompt-tokens" in result.stdout and "(default 7.0)" in result.stdout  # lam
    assert "--lam-start" not in result.stdout  # AlignFed's
    assert len(result.stdout.splitlines()) < 200


_NO_TORCH = """
import sys
from fedtsp.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print("torch imported" if "torch" in sys.modules else "no torch")
"""


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["run", "--algorithm", "fedtsp", "--help"],
        ["run", "--alpha", "abc"],
        ["run", "--algorithm", "fedtsp", "--lam", "-1"],
        ["run", "--dataset", "mnist"],
        ["reproduce", "--profile", "nope"],
        ["reproduce", "--only", "99"],
        ["verify", "--sample", "0"],
        ["partition", "--alpha", "0", "--export", "x"],
        ["describe", "--dataset", "cifar10", "--variant", "x"],
        ["claims"],  # reads claims.csv and the profile's settings: nothing needs torch
        ["run", "--family", "homo-nosuch"],
    ],
)
def test_help_and_bad_flags_answer_without_importing_torch(args):
    # What makes `fedtsp --help` take seconds is importing torch (and the methods); the
    # committed benchmark (benchmarks/results/cli_latency.md) times the commands themselves.
    result = subprocess.run(
        [sys.executable, "-c", _NO_TORCH, *args], capture_output=True, text=True, cwd=REPO
    )
    assert result.stdout.strip().splitlines()[-1] == "no torch", result.stderr


def test_every_commands_help_reads_as_text():
    """argparse %-formats option help but prints a description as written: a doubled or
    unfilled percent sign in either shows up literally."""
    from fedtsp.cli import build_parser

    parser = build_parser([])
    commands = parser._subparsers._group_actions[0].choices
    assert {"run", "reproduce", "verify", "claims", "partition"} <= set(commands)
    for name, command in commands.items():
        text = command.format_help()
        assert "%%" not in text and "%(" not in text, name
        assert len(text.splitlines()) > 5, name


def test_help_states_the_defaults_and_the_version(capsys):
    from fedtsp import __version__

    result = _run_cli("run", "--help")
    text = " ".join(result.stdout.split())
    for flag, default in (("--rounds", 300), ("--local-epochs", 5), ("--family", "htfe9")):
        assert f"{flag} {flag.lstrip('-').replace('-', '_').upper()}" in result.stdout
        assert f"(default {default})" in text, flag
    assert "homo-<architecture>" in text and "fedavgcnn_s" in text  # the families' epilog
    assert "(default False)" not in text and "(default None)" not in text
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"fedtsp {__version__}"


def test_an_unknown_flag_points_to_its_commands_help(capsys):
    with pytest.raises(SystemExit) as done:
        main(["claims", "--profle", "cpu"])
    err = capsys.readouterr().err
    assert done.value.code == 2
    assert "unrecognized arguments: --profle (see `fedtsp claims --help`)" in err


@pytest.mark.parametrize(
    ("command", "handler", "advice"),
    [
        (["run", "--no-progress"], "_cmd_run", "--resume"),
        (["reproduce", "--no-progress"], "_cmd_reproduce", "rerun the same command"),
        (["verify", "--sample", "1"], "_cmd_verify", "store is unchanged"),
        (["claims"], "_cmd_claims", ""),
    ],
)
def test_an_interrupt_says_how_to_go_on_for_its_command(
    command, handler, advice, monkeypatch, capsys
):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(f"fedtsp.cli.{handler}", interrupted)
    assert main(command) == 130
    err = capsys.readouterr().err.strip()
    assert err.startswith("fedtsp: interrupted") and advice in err
    if command[0] != "run":
        assert "--resume" not in err  # only `run` has it
    if not advice:
        assert err == "fedtsp: interrupted"


def test_the_catalogue_matches_the_registries():
    from fedtsp import catalogue

    assert catalogue.PATH.read_text() == catalogue.text(), (
        "fedtsp/catalogue.json is stale: run python -m fedtsp.catalogue"
    )


@pytest.mark.parametrize(
    "changes",
    [
        {"dataset": "imagenet"},
        {"alpha": 0.0},
        {"family": "htfe7"},
        {"algorithm": "fedfoo"},
        {"algorithm": "local", "algo_options": {"lam": 1.0}},
        {"algorithm": "fedtsp", "algo_options": {"prompt_tokens": "x"}},
        {"algorithm": "fedtsp", "algo_options": {"lam": -1.0}},
        {"algorithm": "fedtsp", "algo_options": {"prompts": "extra"}},
    ],
)
def test_the_quick_checks_say_what_check_run_says(changes):
    from fedtsp.cli import _check_listed
    from fedtsp.core.config import ConfigError, RunConfig
    from fedtsp.engine.runspec import check_run

    config = RunConfig(**changes)
    with pytest.raises(ConfigError) as quick:
        _check_listed(config)
    with pytest.raises(ConfigError) as full:
        check_run(config)
    assert str(quick.value) == str(full.value)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--dataset", "imagenet"], "--dataset imagenet is invalid; choose one of"),
        (["--alpha", "0"], "--alpha 0.0 is invalid"),
        (["--alpha", "-1"], "--alpha -1.0 is invalid"),
        (["--family", "htfe7"], "unknown model family 'htfe7'"),
        (["--algorithm", "fedfoo"], "--algorithm fedfoo is invalid"),
        (["--fraction", "1.5"], "--fraction 1.5 is invalid"),
        (["--rounds", "0"], "--rounds 0 is invalid"),
        (["--precision", "fp8"], "--precision fp8 is invalid"),
        (["--algorithm", "local", "--lam", "1"], "algorithm 'local' has no option(s) lam"),
        (["--algorithm", "fedtsp", "--prompt-tokens", "x"], "--prompt-tokens x is invalid"),
        (["--algorithm", "fedtsp", "--text-encoder", "gpt"], "--text-encoder gpt is invalid"),
        (["--data", "/no/such/archive.tar.gz"], "--data '/no/such/archive.tar.gz' does not exist"),
    ],
)
def test_bad_values_fail_fast_with_one_sentence(capsys, args, message):
    start = time.perf_counter()
    code = main(["run", *args, "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err
    assert err.count("\n") == 1  # one line
    assert time.perf_counter() - start < 10


def test_more_clients_than_samples_fails_fast(capsys, tiny_archive, tmp_path, monkeypatch):
    monkeypatch.setenv("FEDTSP_CACHE", str(tmp_path / "cache"))
    code = main(
        ["run", "--data", str(tiny_archive), "--num-clients", "500", "--out", str(tmp_path)]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert "500" in err and "client" in err


def test_missing_dataset_names_places_looked(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("FEDTSP_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("FEDTSP_DATA", raising=False)
    # torchvision's download would need the internet; the loader must say where it looked.
    code = main(["partition", "--dataset", "tinyimagenet", "--export", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert code == 2
    assert "tinyimagenet" in err and str(tmp_path / "cache") in err


def test_run_and_partition_from_an_image_folder_archive(tiny_archive, tmp_path, monkeypatch):
    monkeypatch.setenv("FEDTSP_CACHE", str(tmp_path / "cache"))
    common = [
        "--data",
        str(tiny_archive),
        "--num-clients",
        "2",
        "--alpha",
        "5",
        "--batch-size",
        "4",
    ]
    out = tmp_path / "runs"
    args = ["run", *common, "--family", "htfe-cpu", "--algorithm", "fedproto", "--rounds", "1"]
    args += ["--local-epochs", "1", "--out", str(out), "--no-progress"]
    assert main(args) == 0
    (first,) = out.glob("*.json")
    written = first.stat().st_mtime_ns
    assert main(args) == 0  # second time: served from the store, the record left as it was
    assert list(out.glob("*.json")) == [first] and first.stat().st_mtime_ns == written
    # The same run with its clients in two processes: same history, its workers recorded.
    forced = [*args, "--client-workers", "2", "--force"]
    (record_file,) = out.glob("*.json")
    before = json.loads(record_file.read_text())
    assert main(forced) == 0
    after = json.loads(record_file.read_text())
    assert after["environment"]["client_workers"] == 2
    assert [r["acc"] for r in after["history"]] == [r["acc"] for r in before["history"]]
    export = tmp_path / "export"
    assert main(["partition", *common, "--export", str(export)]) == 0
    assert sorted(p.name for p in (export / "train").iterdir()) == ["0.npz", "1.npz"]
    assert (export / "config.json").exists()


def test_htfllib_protocol_flags_reach_the_run_config():
    from fedtsp.cli import _config_from_args, build_parser

    def config(*flags: str):
        return _config_from_args(build_parser([]).parse_args(["run", *flags]))

    plain = config()
    matched = config(
        "--batch-order", "fixed", "--client-init", "shared", "--undersized-clients", "skip"
    )
    assert (plain.batch_order, plain.client_init) == ("shuffled", "independent")
    assert (matched.batch_order, matched.client_init) == ("fixed", "shared")
    assert (plain.undersized_clients, matched.undersized_clients) == ("train", "skip")
    assert matched.key() != plain.key()


def test_an_error_names_the_flag_the_user_typed_not_the_config_field():
    from fedtsp.cli import _as_flags, build_parser

    parser = build_parser(["run", "--algorithm", "fedtsp"])
    run = parser._subparsers._group_actions[0].choices["run"]
    assert (
        _as_flags("num_clients=0 is invalid; need 1", run) == "--num-clients 0 is invalid; need 1"
    )
    assert _as_flags("a: server_lr=-1.0 is invalid", run) == "a: --server-lr -1.0 is invalid"
    assert _as_flags("trainable_prompts='x' is invalid", run) == "--trainable-prompts x is invalid"
    # Not a flag of this command, or a population's own parameter: left as written.
    assert _as_flags("context_length=9 is invalid", run) == "context_length=9 is invalid"
    kept = "population num_clients=0 is invalid"
    assert _as_flags(kept, run) == kept
