"""The `describe()` entry point and the `fedtsp describe` command around it."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from fedtsp.core import environment
from fedtsp.core.errors import one_line
from fedtsp.text.describe.backend import Backend
from fedtsp.text.describe.classes import resolve_classes
from fedtsp.text.describe.errors import DescribeError, DescribeInputError
from fedtsp.text.describe.generate import existing_entries, generate_descriptions, today
from fedtsp.text.describe.prompts import (
    SCHEMA,
    VARIANTS,
    check_k,
    check_variant,
    instruction_text,
    request_template,
)
from fedtsp.text.describe.providers import (
    DEFAULT_API_KEY_ENV,
    DEFAULT_BASE_URL,
    PROVIDERS,
    ChatClient,
    mask_secret,
)

EXIT_BAD_INPUT = 2
EXIT_FAILED = 1


def describe(
    dataset: str,
    backend: Backend | str,
    *,
    variant: str = "long",
    out: str | Path | None = None,
    k: int = 3,
    wnids: str | Path | None = None,
    class_words: str | Path | None = None,
    force: bool = False,
    progress: bool = True,
    client: ChatClient | None = None,
) -> Path:
    """Write (or complete) the description file of `dataset`; returns its path.

    ``backend``: the model that writes (a `Backend`, or a model id for the default
    OpenAI-compatible API). Every input is checked before the first request
    (`DescribeInputError`). `client` replaces the backend's client (for tests and custom
    back ends). Generation failures raise `DescribeError` naming the class.
    """
    backend = Backend(backend) if isinstance(backend, str) else backend
    check_variant(variant)
    check_k(k)
    backend.check()
    name, title, classes = resolve_classes(dataset, wnids=wnids, class_words=class_words)
    secret = backend.secret()
    if backend.provider == "openai" and client is None and secret is None:
        raise DescribeInputError(
            f"environment variable {backend.api_key_env} holds no API key; set it (the key "
            "is read only from the environment) or name another with --api-key-env"
        )
    meta = {
        "dataset": name,
        "variant": variant,
        "k": k,
        "written_by": None,
        "provider": backend.provider,
        "model": backend.model_id,
        "date": today(),
        "instruction": instruction_text(variant, k),
        "request": request_template(title),
        "generation": None,
        "schema": SCHEMA,
    } | backend.provenance()
    out_path = Path(out).expanduser() if out is not None else Path(f"{name}_{variant}.json")
    # Refuse a foreign or incompatible file before loading a model or sending a request.
    existing_entries(out_path, meta, classes, force, warn=False)
    generate_descriptions(
        classes,
        client or backend.client(secret),
        out_path,
        meta,
        dataset_title=title,
        retries=backend.retries,
        force=force,
        progress=progress,
        secret=secret,
    )
    return out_path


def add_describe_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``describe`` command to an argparse sub-parser collection."""
    p = subparsers.add_parser(
        "describe",
        help="have a language model write the class descriptions (FedTSP prompts)",
        description=(
            "Ask a language model for k descriptions per class (appearance, function, "
            "environment) and write them in the authors' JSON schema. Resumable: rerunning "
            "the same command only asks for the classes missing from --out."
        ),
    )
    p.add_argument("--dataset", required=True, help="cifar10, cifar100, tinyimagenet or fmnist")
    p.add_argument("--variant", default="long", choices=VARIANTS, help="description length")
    p.add_argument("--provider", default="openai", choices=PROVIDERS)
    p.add_argument(
        "--model", required=True, help="model id (openai) or a local model folder (local)"
    )
    p.add_argument("--base-url", default=DEFAULT_BASE_URL, help="OpenAI-compatible API root")
    p.add_argument(
        "--api-key-env",
        default=DEFAULT_API_KEY_ENV,
        help="environment variable holding the API key (default OPENAI_API_KEY)",
    )
    p.add_argument("--out", default=None, help="output file (default ./<dataset>_<variant>.json)")
    p.add_argument("--k", type=int, default=3, help="descriptions per class (default 3)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per request")
    p.add_argument(
        "--retries", type=int, default=5, help="retries per class after the first attempt"
    )
    p.add_argument(
        "--wnids", default=None, help="Tiny-ImageNet: wnids.txt, or the dataset folder or .zip"
    )
    p.add_argument("--class-words", default=None, help="Tiny-ImageNet: words.txt (wnid<TAB>words)")
    p.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="sampling temperature sent to the API (default: the server's)",
    )
    p.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help="answer length limit (openai: not sent by default; local: 512 new tokens)",
    )
    p.add_argument("--device", default="auto", help="local provider: cpu, cuda[:i] or auto")
    p.add_argument("--force", action="store_true", help="regenerate classes already in --out")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def run_describe(args: argparse.Namespace) -> int:
    """Run ``fedtsp describe``; returns the exit status (0 ok, 1 failed, 2 bad input)."""
    env = getattr(args, "api_key_env", DEFAULT_API_KEY_ENV) or DEFAULT_API_KEY_ENV
    secret = environment.secret(env) if re.fullmatch(r"\w+", env) else None
    try:
        backend = Backend(
            model=args.model,
            provider=args.provider,
            base_url=args.base_url,
            api_key_env=env,
            timeout=args.timeout,
            retries=args.retries,
            temperature=args.temperature,
            max_tokens=args.max_tokens,
            device=args.device,
        )
        path = describe(
            args.dataset,
            backend,
            variant=args.variant,
            out=args.out,
            k=args.k,
            wnids=args.wnids,
            class_words=args.class_words,
            force=args.force,
            progress=not args.no_progress,
        )
    except DescribeInputError as exc:
        if getattr(args, "debug", False) or environment.debug_requested():
            raise
        print(f"fedtsp: error: {mask_secret(one_line(exc), secret)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except DescribeError as exc:
        print(f"fedtsp describe: error: {mask_secret(str(exc), secret)}", file=sys.stderr)
        print(
            "fedtsp describe: the classes done so far are kept; rerun the same command to continue",
            file=sys.stderr,
        )
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("fedtsp describe: interrupted; rerun the same command to continue", file=sys.stderr)
        return 130
    data = json.loads(path.read_text(encoding="utf-8"))
    n = sum(1 for key in data if not key.startswith("_"))
    print(f"wrote {n} classes ({args.variant}, k={args.k}) to {path}")
    return 0
