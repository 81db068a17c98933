"""Command line: `fedtsp run`, `partition`, `describe`, `reproduce`, `verify`, `claims`
(also `python -m fedtsp ...`)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import re
import sys
from pathlib import Path
from typing import Any, NoReturn

from fedtsp import __version__, catalogue
from fedtsp.core.config import (
    BATCH_ORDERS,
    CLIENT_INITS,
    FAILURE_POLICIES,
    LAYOUTS,
    ROUND_TIMEOUT,
    UNDERSIZED_CLIENTS,
    ConfigError,
    RunConfig,
    bad,
)
from fedtsp.core.environment import debug_requested
from fedtsp.core.errors import RunFailedError, UserError, one_line
from fedtsp.core.isa import LEVELS as ISA_LEVELS
from fedtsp.core.isa import choose as choose_isa
from fedtsp.core.isa import refuse_partial
from fedtsp.core.options import check_given
from fedtsp.core.paths import portable_path

EXIT_BAD_INPUT = 2
EXIT_RUN_FAILED = 1
PAPERMILL_DIR = "papermill_runs"  # `fedtsp reproduce`: where the executed notebooks go


class CliError(UserError):
    """Bad user input found before any long work starts."""


class _Parser(argparse.ArgumentParser):
    """argparse with its usage errors on one line, in the same form as every other user error."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"fedtsp: error: {message} (see `{self.prog} --help`)\n")


def _catalogue() -> str:
    listed = catalogue.load()
    families = "; ".join(
        f"{name} = {', '.join(archs)}" for name, archs in listed["families"].items()
    )
    return (
        f"datasets: {', '.join(listed['datasets'])}\n"
        f"model families: {families}; or homo-<architecture>, one architecture for every "
        f"client, of: {', '.join(listed['architectures'])}\n"
        f"algorithms: {', '.join(listed['algorithms'])}"
    )


def _option_flags() -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """Every algorithm option, grouped by option name (several methods may share one)."""
    flags: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for algo in catalogue.algorithm_names():
        for option in catalogue.options(algo):
            flags.setdefault(option["name"], []).append((algo, option))
    return flags


def _named_algorithm(argv: list[str]) -> str | None:
    """The value of `--algorithm` on the command line, if any (decides which options
    `fedtsp run --help` shows)."""
    for i, word in enumerate(argv):
        if word == "--algorithm" and i + 1 < len(argv):
            return argv[i + 1]
        if word.startswith("--algorithm="):
            return word.partition("=")[2]
    return None


def _add_data_args(
    parser: argparse.ArgumentParser, defaults: RunConfig, population: bool = True
) -> None:
    group = parser.add_argument_group("data and partition")
    datasets = ", ".join(catalogue.load()["datasets"])
    group.add_argument("--dataset", default=defaults.dataset, help=f"one of {datasets}")
    group.add_argument(
        "--data",
        default=None,
        help="dataset archive or folder (else $FEDTSP_DATA, the cache, torchvision)",
    )
    group.add_argument(
        "--alpha", type=float, default=defaults.alpha, help="Dirichlet concentration (> 0)"
    )
    group.add_argument(
        "--num-clients", type=int, default=defaults.num_clients, help="number of clients"
    )
    group.add_argument(
        "--fraction",
        type=float,
        default=defaults.fraction,
        help="stratified subsample of the merged data, in (0, 1]",
    )
    group.add_argument(
        "--min-client-samples",
        type=int,
        default=None,
        help="minimum client size (default: the authors' rule scaled by --fraction)",
    )
    group.add_argument(
        "--partition-seed",
        type=int,
        default=defaults.partition_seed,
        help="seed of the subsample and the partition",
    )
    if population:  # `partition` exports Dirichlet splits only
        group.add_argument(
            "--population",
            default=None,
            help="clients from planted groups instead of a Dirichlet partition: label-groups "
            "or overlapping-labels (--dataset cifar100), mixed-domain (--dataset cifar10 + "
            "Fashion-MNIST)",
        )
    group.add_argument(
        "--batch-size", type=int, default=defaults.batch_size, help="local training batch size"
    )


def _layout(value: str) -> bool | None:
    """--layout value -> RunConfig.channels_last."""
    if value not in LAYOUTS:
        raise argparse.ArgumentTypeError(f"choose one of {', '.join(LAYOUTS)}")
    return LAYOUTS[value]


def _add_isa_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--isa",
        choices=ISA_LEVELS,
        help="CPU kernels: avx2 pins PyTorch, oneDNN, MKL and NumPy to AVX2, so the record "
        "reruns bit for bit on any x86-64 machine (the default, unless the environment sets "
        "all of ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA, MKL_CBWR itself); native uses the "
        "CPU's best (faster on AVX-512, checkable only on a like CPU)",
    )


def _choose_isa(args: argparse.Namespace) -> None:
    """The kernels of this command's runs, before anything imports torch: --isa wins, then a
    complete setting in the environment; a partial one is refused."""
    if args.isa is not None:
        choose_isa(args.isa)
    refuse_partial()


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser; `argv` (default: this process's arguments) only decides which method's
    options `fedtsp run --help` lists: those of its `--algorithm`, else none."""
    defaults = RunConfig()
    chosen = _named_algorithm(sys.argv[1:] if argv is None else argv)
    parser = _Parser(
        prog="fedtsp",
        description="Federated learning with text-derived class prototypes (FedTSP).",
        epilog=_catalogue(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"fedtsp {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser(
        "run",
        help="run one federated experiment",
        epilog=_catalogue(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_data_args(run, defaults)
    _add_isa_arg(run)
    group = run.add_argument_group("training")
    group.add_argument(
        "--setting",
        default=None,
        help="htfl (heterogeneous models), gfl or pfl (one architecture, e.g. --family "
        f"homo-cpu); default {defaults.setting}, or the --preset's",
    )
    group.add_argument("--family", default=defaults.family, help="model family (see below)")
    group.add_argument(
        "--algorithm", help=f"method (see below; default {defaults.algorithm}, with its defaults)"
    )
    group.add_argument(
        "--preset",
        metavar="LABEL",
        help="a method label of fedtsp/paper/profiles.toml: its algorithm and options, e.g. "
        "FedTSP-MiniLM (the full method: LLM descriptions + trainable prompts) or "
        '"FedTSP (authors\' runs)"; flags given beside it override its options',
    )
    group.add_argument(
        "--rounds", type=int, default=defaults.rounds, help="communication rounds (the paper's)"
    )
    group.add_argument(
        "--local-epochs", type=int, default=defaults.local_epochs, help="epochs per round"
    )
    group.add_argument("--lr", type=float, default=defaults.lr, help="clients' SGD learning rate")
    group.add_argument(
        "--seed", type=int, default=defaults.seed, help="seed of the models and training"
    )
    # The protocol fields HtFLlib sets otherwise (docs/baselines.md's defaults table).
    for field, choices, text in (
        ("batch_order", BATCH_ORDERS, "shuffled (every epoch) or fixed (the stored order)"),
        ("client_init", CLIENT_INITS, "independent weights, or shared: one per architecture"),
        ("undersized_clients", UNDERSIZED_CLIENTS, "clients smaller than one batch: train, skip"),
    ):
        flag = "--" + field.replace("_", "-")
        group.add_argument(flag, default=getattr(defaults, field), choices=choices, help=text)
    group.add_argument(
        "--feature-dim",
        type=int,
        default=None,
        help="feature width d (default: the method's / 512)",
    )
    group.add_argument(
        "--global-eval-every",
        type=int,
        default=0,
        help="evaluate on the official test set every k rounds (0: never)",
    )
    group.add_argument("--device", default=defaults.device, help="cpu or cuda[:i]")
    group.add_argument("--precision", default=defaults.precision, help="fp32 or bf16 (autocast)")
    group.add_argument(
        "--layout",
        dest="channels_last",
        type=_layout,
        default=None,
        metavar="{auto,channels-last,nchw}",
        help="image memory layout (auto: channels-last on CPU, NCHW on CUDA)",
    )
    group = run.add_argument_group("output")
    group.add_argument("--out", default="runs", help="run-store folder (default: ./runs)")
    group.add_argument(
        "--resume", action="store_true", help="continue an interrupted run from its checkpoint"
    )
    group.add_argument(
        "--checkpoint-every",
        type=int,
        default=None,
        help="write a resumable checkpoint every k rounds (default: auto, as often as keeps "
        "checkpoints near 1%% of the run's time)",
    )
    group.add_argument("--force", action="store_true", help="rerun even if the store has this run")
    group.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    group.add_argument("--json", action="store_true", help="print the summary as JSON")
    group = run.add_argument_group("engine (Flower needs: pip install 'fedtsp[flower]')")
    group.add_argument(
        "--engine",
        choices=("simulator", "flower-sim", "flower-processes"),
        default="simulator",
        help="simulator (in-process, default), flower-sim (Flower's Ray simulation engine) or "
        "flower-processes (a SuperLink and one SuperNode process per client on 127.0.0.1)",
    )
    group.add_argument(
        "--client-workers",
        type=int,
        default=1,
        metavar="N",
        help="simulator: run the clients in N processes with one thread each (default 1: all "
        "in this process); faster for small models on a multi-core CPU, same results as one "
        "thread",
    )
    group.add_argument(
        "--on-client-failure",
        choices=FAILURE_POLICIES,
        default=None,
        help="Flower engines: stop the run when a client fails, or continue without it "
        f"(default {FAILURE_POLICIES[0]})",
    )
    group.add_argument(
        "--round-timeout",
        type=float,
        default=None,
        help="Flower engines: seconds to wait for a round's replies before a client counts as "
        f"failed (default {ROUND_TIMEOUT:.0f})",
    )
    group.add_argument(
        "--workdir", default=None, help="Flower engines: work folder (default: OUT/flower-work)"
    )
    if chosen in catalogue.algorithm_names():
        group = run.add_argument_group(f"options of --algorithm {chosen}")
    else:
        group = run.add_argument_group(
            "algorithm options",
            "each method has its own: `fedtsp run --algorithm NAME --help` lists them",
        )
    for name, owners in _option_flags().items():
        mine = [option for algo, option in owners if algo == chosen]
        text = f"{mine[0]['help']} (default {mine[0]['default']})" if mine else argparse.SUPPRESS
        # Switches (--x / --no-x) for options that are booleans in every method that has them.
        switch = all(option["type"] == "bool" for _, option in owners)
        group.add_argument(
            f"--{name.replace('_', '-')}",
            dest=f"opt_{name}",
            default=None,
            help=text,
            **({"action": argparse.BooleanOptionalAction} if switch else {"metavar": name.upper()}),
        )

    from fedtsp.text.describe import add_describe_parser

    add_describe_parser(sub)

    rep = sub.add_parser(
        "reproduce", help="execute the numbered notebooks with papermill at a profile"
    )
    rep.add_argument(
        "--profile",
        default="cpu",
        help="smoke, cpu, evidence or paper (fedtsp/paper/profiles.toml)",
    )
    rep.add_argument("--only", nargs="+", metavar="NN", help="notebook prefixes, e.g. 02 03")
    _add_isa_arg(rep)
    rep.add_argument("--workers", type=int, help="parallel runs (default: the profile's)")
    rep.add_argument(
        "--executor",
        choices=["local", "ray"],
        default="local",
        help="where the runs execute: this machine's processes (default), or one Ray task per "
        "run on a Ray cluster (the profile's [P.resources] size each task)",
    )
    rep.add_argument(
        "--ray-address",
        metavar="ADDRESS",
        help="the Ray cluster to use (default: Ray's RAY_ADDRESS, else a Ray instance started here)",
    )
    rep.add_argument(
        "--devices",
        type=int,
        metavar="N",
        help="with --plan: estimate the wall time on N GPUs (a GPU profile)",
    )
    rep.add_argument("--results", default="results", help="results root (default: results)")
    rep.add_argument("--papermill-dir", help=f"executed notebooks root (default {PAPERMILL_DIR})")
    rep.add_argument(
        "--no-progress", dest="progress", action="store_false", help="a line per run, no bars"
    )
    rep.add_argument(
        "--plan",
        action="store_true",
        help="list the runs (stored and new) and estimate the new ones' wall time; run nothing",
    )
    rep.add_argument(
        "--prune",
        action="store_true",
        help="after the runs, delete the store's records that no notebook of the profile uses "
        "(every notebook must be selected)",
    )
    rep.add_argument(
        "--allow-partial",
        action="store_true",
        help="exit 0 even if a notebook lacked something the profile expects (see the summary)",
    )

    ver = sub.add_parser(
        "verify",
        help="rerun stored runs from scratch with today's code and compare their histories",
        description="Rerun the runs behind a table cell (e.g. `fedtsp verify --profile cpu "
        "table1 FedTSP-MiniLM cifar100`), given run keys, or a seeded random sample of the "
        "profile's store, and report per run: identical history, or the largest difference "
        "per metric and the first round where they part. Exit 0 only when every rerun is "
        "identical.",
    )
    ver.add_argument(
        "table",
        nargs="?",
        help="fig1, table1, appendixD, table2, fig5, table4, table3 or fmcl",
    )
    ver.add_argument(
        "values", nargs="*", help="labels every chosen run has (method, dataset, alpha, ...)"
    )
    ver.add_argument("--profile", default="cpu", help="whose run store (default: cpu)")
    ver.add_argument(
        "--key",
        nargs="+",
        default=[],
        metavar="KEY",
        help="run keys to verify (whole, or their first 6 or more characters)",
    )
    ver.add_argument("--sample", type=int, metavar="N", help="a random sample of N stored runs")
    ver.add_argument("--sample-seed", type=int, help="seed of --sample (default 0)")
    ver.add_argument("--workers", type=int, default=1, help="parallel reruns (default 1)")
    ver.add_argument("--results", default="results", help="results root (default: results)")
    ver.add_argument("--report", metavar="FILE", help="also write the result as Markdown")

    claims = sub.add_parser(
        "claims",
        help="the papers' claims and their verdicts at a profile, from its claims.csv",
        description="Print a profile's bottom line and every claim's verdict; with claim ids, "
        "those claims' parts (effect, 95 % interval, paired seeds, verdict); with --against, "
        "which verdicts changed from another profile's and what moved (seeds, how the rival was "
        "chosen, interval width, convergence, testability). Reads the committed results; runs "
        "nothing.",
    )
    claims.add_argument("ids", nargs="*", metavar="ID", help="claims to show, e.g. F11 M2")
    claims.add_argument("--profile", default="cpu", help="whose verdicts (default: cpu)")
    claims.add_argument("--against", metavar="PROFILE", help="compare with this profile's verdicts")
    claims.add_argument("--results", default="results", help="results root (default: results)")

    part = sub.add_parser(
        "partition", help="partition a dataset by Dirichlet and export it (HtFLlib layout)"
    )
    _add_data_args(part, defaults, population=False)
    part.add_argument(
        "--export", required=True, help="output folder (train/<i>.npz, test/<i>.npz, config.json)"
    )
    for command in sub.choices.values():
        command.add_argument(
            "--debug",
            action="store_true",
            help="show the full traceback of an error (also: FEDTSP_DEBUG=1)",
        )
        _state_defaults(command)
    return parser


def _state_defaults(parser: argparse.ArgumentParser) -> None:
    """Append "(default X)" to each option's help that does not say its default already
    (switches and an unset None need no words)."""
    for action in parser._actions:
        default = action.default
        if default in (None, [], argparse.SUPPRESS) or action.nargs == 0:  # switches too
            continue
        if action.help == argparse.SUPPRESS or "default" in (action.help or ""):
            continue
        action.help = (
            f"{action.help} (default %(default)s)" if action.help else "(default %(default)s)"
        )


def _config_from_args(args: argparse.Namespace) -> RunConfig:
    """A validated RunConfig from the parsed flags (flag names equal the config fields)."""
    values = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(RunConfig)
        if hasattr(args, f.name)
    }
    options = {
        key[4:]: value
        for key, value in vars(args).items()
        if key.startswith("opt_") and value is not None
    }
    if getattr(args, "preset", None):
        values, options = _preset(args, values, options)
    # Flags left at None (--algorithm, --setting, ...) take the config's defaults.
    values = {k: v for k, v in values.items() if v is not None}
    config = RunConfig(**values, algo_options=options)
    _check_listed(config)
    from fedtsp.engine.runspec import check_run  # imports torch: after the quick checks

    config = check_run(config)
    if not options:
        return config
    # Store typed option values so the run's hash does not depend on CLI spelling.
    from fedtsp.algorithms import resolve_options

    typed = dataclasses.asdict(resolve_options(config.algorithm, options))
    return config.replace(algo_options={k: typed[k] for k in options})


def _check_listed(config: RunConfig) -> None:
    """The checks that need no method code (the catalogue's names and declarations, the
    config's own ranges), so that a bad value is one line in milliseconds; `check_run`
    makes them again with the methods loaded, and the rest."""
    listed = catalogue.load()
    if config.dataset not in listed["datasets"]:
        bad("dataset", config.dataset, f"choose one of {', '.join(listed['datasets'])}")
    config.validate()
    if str(config.family).strip().lower() not in listed["family_names"]:  # as resolve_family
        raise ConfigError(
            f"unknown model family {config.family!r}; choose one of "
            f"{', '.join(listed['families'])} or homo-<architecture>"
        )
    if config.algorithm not in listed["algorithms"]:
        bad("algorithm", config.algorithm, f"choose one of {', '.join(listed['algorithms'])}")
    declared = {
        o["name"]: (catalogue.annotation(o), o["bounds"], o["choices"])
        for o in catalogue.options(config.algorithm)
    }
    check_given(config.algorithm, dict(config.algo_options), declared)


def _preset(
    args: argparse.Namespace, values: dict[str, Any], options: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """`--preset LABEL`: the label's algorithm, setting and options under the given flags."""
    from fedtsp.paper.profiles import method_specs

    specs = method_specs()
    if args.preset not in specs:
        raise CliError(f"--preset {args.preset!r} is unknown; choose one of: {', '.join(specs)}")
    spec = dict(specs[args.preset])
    algorithm = spec.pop("algorithm")
    if args.algorithm is not None and args.algorithm != algorithm:
        raise CliError(
            f"--preset {args.preset!r} runs --algorithm {algorithm}, not {args.algorithm}; "
            "give one of the two"
        )
    setting = spec.pop("setting", None)
    if setting is not None and values.get("setting") not in (None, setting):
        raise CliError(
            f"--preset {args.preset!r} runs --setting {setting}, not {values['setting']}; "
            "give one of the two"
        )
    if setting is not None:
        values["setting"] = setting
    return values | {"algorithm": algorithm}, spec | options


def _check_data_path(path: str | None) -> None:
    if path is not None and not Path(path).exists():
        raise CliError(f"--data {path!r} does not exist; give a dataset archive or folder")


def _check_folder(flag: str, path: str | None) -> None:
    """An output folder may be missing (it is created) but not be something else."""
    if path is not None and Path(path).exists() and not Path(path).is_dir():
        raise CliError(
            f"{flag} {path!r} is a file, not a folder; give a folder (created if missing)"
        )


def _check_report(path: str | None) -> None:
    """A report file that could not be written would be found only after the reruns."""
    if path is None:
        return
    parent = Path(path).parent
    if Path(path).is_dir() or (parent.exists() and not parent.is_dir()):
        raise CliError(f"--report {path!r} cannot be a file; give a file path in a folder")
    if not parent.exists():
        raise CliError(f"--report {path!r}: the folder {str(parent)!r} does not exist")


def _cmd_run(args: argparse.Namespace) -> int:
    _choose_isa(args)
    _check_data_path(args.data)
    _check_folder("--out", args.out)
    _check_folder("--workdir", args.workdir)
    if args.resume and args.force:
        raise CliError("--resume continues the stored checkpoint and --force discards it; give one")
    flower_only = {
        "--on-client-failure": args.on_client_failure,
        "--round-timeout": args.round_timeout,
        "--workdir": args.workdir,
    }
    given = [flag for flag, value in flower_only.items() if value is not None]
    if given and args.engine == "simulator":
        raise CliError(
            f"{', '.join(given)}: option(s) of the Flower engines; add --engine flower-sim "
            "or flower-processes, or leave them out"
        )
    if args.round_timeout is not None and not (0 < args.round_timeout < float("inf")):
        raise CliError(f"--round-timeout {args.round_timeout} is invalid; give seconds > 0")
    if args.client_workers < 1:
        raise CliError(f"--client-workers {args.client_workers} is invalid; give an integer >= 1")
    if args.client_workers > 1 and args.engine != "simulator":
        raise CliError(
            "--client-workers is an option of the simulator engine; Flower runs "
            "one process per client already"
        )
    config = _config_from_args(args)
    if args.engine != "simulator":
        from fedtsp.engine.flower.launch import FLOWER_MISSING, run_flower

        try:
            import flwr  # noqa: F401
        except ImportError:
            raise CliError(FLOWER_MISSING) from None
        record = run_flower(
            config,
            engine=args.engine,
            data=args.data,
            out=args.out,
            workdir=args.workdir,
            force=args.force,
            on_failure=args.on_client_failure or FAILURE_POLICIES[0],
            round_timeout=ROUND_TIMEOUT if args.round_timeout is None else args.round_timeout,
            resume=args.resume,
            checkpoint_every=args.checkpoint_every,
        )
        return _print_run_summary(args, config, record)
    from fedtsp.engine.simulation import run_experiment

    record = run_experiment(
        config,
        data=args.data,
        out=args.out,
        resume=args.resume,
        force=args.force,
        progress=not args.no_progress,
        checkpoint_every=args.checkpoint_every,
        client_workers=args.client_workers,
    )
    return _print_run_summary(args, config, record)


def _print_run_summary(args: argparse.Namespace, config: RunConfig, record: dict) -> int:
    summary = {"key": record["key"], **record["summary"], "cache_hit": record["cache_hit"]}
    # A Flower run that lost clients is kept beside the store, not in it.
    folder = Path(args.out) / ("incomplete" if record.get("failures") else "")
    summary["record"] = str(folder / f"{record['key']}.json")
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        print(
            f"{config.algorithm} on {config.dataset}: best accuracy {summary['best_acc']:.4f} "
            f"(round {summary['best_round']}), mean of last 5 {summary['last5_mean_acc']:.4f}; "
            f"record {summary['record']}" + (" (from the store)" if record["cache_hit"] else "")
        )
    return 0


def _cmd_partition(args: argparse.Namespace) -> int:
    config = _config_from_args(args)
    _check_data_path(args.data)
    _check_folder("--export", args.export)
    from fedtsp.data import export_htfllib, load_dataset
    from fedtsp.engine.build import partition_dataset

    dataset = load_dataset(args.dataset, args.data)
    images, labels, partition = partition_dataset(config, dataset)
    meta = {
        "dataset": args.dataset,
        "seed": args.partition_seed,
        "fraction": args.fraction,
        "source": portable_path(dataset.source),
        "checksum": dataset.checksum,
    }
    export_htfllib(args.export, images, labels, partition, meta)
    sizes = partition.stats()["sizes"]
    print(f"wrote {args.num_clients} clients ({min(sizes)}-{max(sizes)} samples) to {args.export}")
    return 0


def _check_profile(name: str) -> None:
    from fedtsp.paper.profiles import profile_names  # reads profiles.toml only

    if name not in profile_names():
        raise CliError(f"unknown profile {name!r}; choose one of {', '.join(profile_names())}")


def _cmd_reproduce(args: argparse.Namespace) -> int:
    from fedtsp.paper.notebook import NOTEBOOKS_DIR, find_notebooks

    _check_profile(args.profile)
    _choose_isa(args)
    find_notebooks(NOTEBOOKS_DIR, args.only)  # an --only that matches none: one line, at once
    if args.prune and args.only:
        raise UserError("--prune needs every notebook: the others' runs would look unused")
    _check_folder("--results", args.results)
    _check_folder("--papermill-dir", args.papermill_dir)
    ignored = [
        flag
        for flag, given in (
            ("--prune", args.prune),
            ("--allow-partial", args.allow_partial),
            ("--papermill-dir", args.papermill_dir is not None),
        )
        if given
    ]
    if args.plan and ignored:
        raise UserError(f"--plan runs nothing, so {', '.join(ignored)} would do nothing; drop it")
    if args.devices is not None and not args.plan:
        raise UserError("--devices sizes a cluster with --plan; the runs themselves use --executor")
    if args.ray_address is not None and args.executor != "ray":
        raise UserError("--ray-address is an option of --executor ray")
    if args.executor == "ray" and args.workers is not None:
        raise UserError(
            "--workers is an option of the local executor; Ray sizes its tasks "
            "from the profile's [P.resources]"
        )
    from fedtsp.paper.reproduce import reproduce

    if args.plan:
        from fedtsp.paper.plan import plan_reproduction

        return plan_reproduction(args.profile, args.only, args.results, args.workers, args.devices)
    return reproduce(
        args.profile,
        only=args.only,
        results_root=args.results,
        papermill_root=args.papermill_dir or PAPERMILL_DIR,
        workers=args.workers,
        progress=args.progress,
        allow_partial=args.allow_partial,
        prune=args.prune,
        executor=args.executor,
        ray_address=args.ray_address,
    )


def _cmd_verify(args: argparse.Namespace) -> int:
    if args.sample is not None and args.sample < 1:
        raise CliError(f"--sample {args.sample} is invalid; give an integer >= 1")
    if args.workers < 1:
        raise CliError(f"--workers {args.workers} is invalid; give an integer >= 1")
    if args.sample_seed is not None and args.sample is None:
        raise CliError("--sample-seed seeds --sample; give --sample N too")
    _check_profile(args.profile)
    _check_report(args.report)
    from fedtsp.paper.verify import run_verify

    return run_verify(
        args.profile,
        table=args.table,
        values=args.values,
        keys=args.key,
        sample=args.sample,
        sample_seed=args.sample_seed or 0,
        results_root=args.results,
        workers=args.workers,
        report=args.report,
    )


def _cmd_claims(args: argparse.Namespace) -> int:
    for name in (args.profile, args.against or args.profile):
        _check_profile(name)
    if args.against == args.profile:
        raise UserError(f"--against {args.against} names --profile itself; name another profile")
    from fedtsp.paper.claims.changes import changes_markdown, claims_markdown

    if args.against:
        text = changes_markdown(args.results, args.against, args.profile, args.ids)
    else:
        text = claims_markdown(args.results, args.profile, args.ids)
    print(text, end="")
    return 0


# What an interrupted command leaves, and how to go on.
_AFTER_INTERRUPT = {
    "run": "rerun with --resume to continue from the last checkpoint",
    "reproduce": "rerun the same command: stored runs are reused, runs in flight resume from "
    "their checkpoints",
    "verify": "rerun the same command (the store is unchanged)",
    "describe": "rerun the same command: classes already in --out are kept",
}


def _one_line_error(
    exc: BaseException, args: argparse.Namespace, status: int, command: argparse.ArgumentParser
) -> int:
    """Print `exc` as one line and return `status`; with --debug / FEDTSP_DEBUG re-raise it."""
    if args.debug or debug_requested():
        raise exc
    print(f"fedtsp: error: {_as_flags(one_line(exc), command)}", file=sys.stderr)
    return status


def _as_flags(message: str, command: argparse.ArgumentParser) -> str:
    """The config's `field=value is invalid` as the command's flag (`--num-clients 0 is
    invalid`), where the command has one: the user typed the flag, not the field."""
    flags = {a.dest: a.option_strings[0] for a in command._actions if a.option_strings}
    for dest, flag in list(flags.items()):  # an algorithm option's dest is opt_<name>
        if dest.startswith("opt_"):
            flags.setdefault(dest.removeprefix("opt_"), flag)

    def spelled(match: re.Match[str]) -> str:
        field, value = match.group(1), match.group(2).strip("'")
        return f"{flags[field]} {value} is invalid" if field in flags else match[0]

    # (a population's own parameters share some names with flags: left as they are)
    return re.sub(r"(?<![\w.-])(?<!population )(\w+)=(\S+?) is invalid", spelled, message)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = build_parser(argv)
    args, unknown = parser.parse_known_args(argv)
    command = parser._subparsers._group_actions[0].choices[args.command]  # type: ignore[union-attr]
    if unknown:  # the command's own usage, not the top level's
        command.error(f"unrecognized arguments: {' '.join(unknown)}")
    from fedtsp.text.describe import run_describe

    handlers = {
        "run": _cmd_run,
        "partition": _cmd_partition,
        "describe": run_describe,
        "reproduce": _cmd_reproduce,
        "verify": _cmd_verify,
        "claims": _cmd_claims,
    }
    try:
        return handlers[args.command](args)
    except (UserError, FileExistsError) as exc:
        return _one_line_error(exc, args, EXIT_BAD_INPUT, command)
    except RunFailedError as exc:
        return _one_line_error(exc, args, EXIT_RUN_FAILED, command)
    except KeyboardInterrupt:
        print(
            f"fedtsp: interrupted; {_AFTER_INTERRUPT.get(args.command, '')}".rstrip("; "),
            file=sys.stderr,
        )
        return 130


if __name__ == "__main__":
    sys.exit(main())
