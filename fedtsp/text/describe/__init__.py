"""`fedtsp describe`: have a language model write the class descriptions FedTSP encodes.

One request per class asks for a JSON object

    {"Short Label": "...", "Fine-grained Descriptions": ["...", ...k strings]}

covering the class's appearance, its function or behaviour and its typical environment.
Answers are checked, retried when malformed or when the service is busy, and written to a
description file in the authors' schema (see `fedtsp.text.descriptions`) with a `_meta` block
recording the exact instruction, the model, the date, the variant and k.

Two providers:

* ``openai``: any OpenAI-compatible Chat Completions endpoint, spoken to with the standard
  library (no `openai` package). The API key is read only from an environment variable
  (``OPENAI_API_KEY`` unless ``--api-key-env`` names another) and is masked in every message.
* ``local``: a local transformers text-generation model directory, greedy decoding.

The output file is rewritten atomically after every class, so an interrupted run resumes where
it stopped (classes already in the file are kept and skipped; ``--force`` regenerates them).

The package, one concept a module: `prompts` (the request and the answer's schema),
`providers` (the two chat back ends), `backend` (`Backend`: which model writes, and how
to reach it), `classes` (which classes a file covers), `generate`
(asking class by class: retries, resume, atomic writes), `command` (`describe()` and the
CLI), `errors`.
"""

from fedtsp.text.describe.backend import Backend
from fedtsp.text.describe.classes import resolve_classes
from fedtsp.text.describe.command import add_describe_parser, describe, run_describe
from fedtsp.text.describe.errors import (
    DescribeError,
    DescribeInputError,
    MalformedAnswer,
    ProviderError,
    TransientError,
)
from fedtsp.text.describe.generate import backoff_delay, generate_descriptions
from fedtsp.text.describe.prompts import (
    SCHEMA,
    VARIANTS,
    ClassSpec,
    build_messages,
    instruction_text,
    parse_answer,
    request_template,
)
from fedtsp.text.describe.providers import (
    DEFAULT_API_KEY_ENV,
    DEFAULT_BASE_URL,
    PROVIDERS,
    ChatClient,
    LocalChat,
    OpenAIChat,
)

__all__ = [
    "Backend",
    "DEFAULT_API_KEY_ENV",
    "DEFAULT_BASE_URL",
    "PROVIDERS",
    "SCHEMA",
    "VARIANTS",
    "ChatClient",
    "ClassSpec",
    "DescribeError",
    "DescribeInputError",
    "LocalChat",
    "MalformedAnswer",
    "OpenAIChat",
    "ProviderError",
    "TransientError",
    "add_describe_parser",
    "backoff_delay",
    "build_messages",
    "describe",
    "generate_descriptions",
    "instruction_text",
    "parse_answer",
    "request_template",
    "resolve_classes",
    "run_describe",
]
