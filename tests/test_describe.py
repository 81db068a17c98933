"""`fedtsp describe` against a scripted OpenAI-compatible server on 127.0.0.1, and a tiny local LM."""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import threading
import traceback
from collections.abc import Iterator
from datetime import date
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from fedtsp.text import describe as d
from fedtsp.text import descriptions
from fedtsp.text.describe import classes as describe_classes
from fedtsp.text.describe import generate, providers
from fedtsp.text.descriptions import load_descriptions

CIFAR10 = [
    "airplane", "automobile", "bird", "cat", "deer",
    "dog", "frog", "horse", "ship", "truck",
]  # fmt: skip
KEY = "sk-test-Zq7SECRETkey-91xW"  # distinctive: any leak is easy to spot
KEY_ENV = "FEDTSP_TEST_API_KEY"


# --------------------------------------------------------------------------------------------
# A scripted OpenAI-compatible server
# --------------------------------------------------------------------------------------------


def good_answer(name: str, k: int) -> dict:
    return {
        "Short Label": name,
        "Fine-grained Descriptions": [f"{name} aspect {j} in a sentence." for j in range(k)],
    }


class FakeAPI:
    """Chat Completions stub. `script` holds behaviours for the next requests (in order);
    `always` maps a class name to a behaviour used for each of its requests; else "ok"."""

    def __init__(self) -> None:
        self.k = 3
        self.script: list[str] = []
        self.always: dict[str, str] = {}
        self.requests: list[str] = []  # the class of each request, in arrival order
        self.authorised: list[bool] = []
        self.lock = threading.Lock()
        self.release = threading.Event()
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # keep test output clean
                pass

            def _send(self, code: int, body: dict, headers: dict | None = None) -> None:
                raw = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(raw)

            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                auth = self.headers.get("Authorization", "")
                match = re.search(r'Class: "(.*?)"', body["messages"][-1]["content"])
                name = match.group(1) if match else "?"
                with api.lock:
                    api.requests.append(name)
                    api.authorised.append(auth == f"Bearer {KEY}")
                    how = api.always.get(name) or (api.script.pop(0) if api.script else "ok")
                token = auth.removeprefix("Bearer ")
                # The client may have given up already (the "hang" case).
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self._answer(how, name, token)

            def _answer(self, how: str, name: str, token: str) -> None:
                if how == "429":
                    self._send(429, {"error": {"message": "slow down"}}, {"Retry-After": "0"})
                elif how == "500":
                    self._send(500, {"error": {"message": "internal error"}})
                elif how == "500echo":
                    self._send(500, {"error": {"message": f"overloaded for key {token}"}})
                elif how == "401echo":
                    msg = f"Incorrect API key provided: {token}"
                    self._send(401, {"error": {"message": msg}})
                else:
                    if how == "hang":
                        api.release.wait(3.0)
                    content = json.dumps(good_answer(name, api.k))
                    if how == "malformed":
                        content = "Sure! Here are some lovely descriptions for you."
                    elif how == "fenced":
                        content = f"```json\n{content}\n```"
                    message = {"role": "assistant", "content": content}
                    self._send(200, {"choices": [{"index": 0, "message": message}]})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    def reset(self) -> None:
        with self.lock:
            self.requests.clear()
            self.authorised.clear()
            self.script.clear()
            self.always.clear()


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeAPI]:
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.setenv(KEY_ENV, KEY)
    server = FakeAPI()
    server.thread.start()
    yield server
    server.release.set()
    server.server.shutdown()
    server.server.server_close()


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Backoff pauses requested by the client (not actually slept)."""
    delays: list[float] = []
    monkeypatch.setattr(generate, "_sleep", delays.append)
    return delays


def cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="fedtsp")
    sub = parser.add_subparsers(dest="command", required=True)
    d.add_describe_parser(sub)
    args = parser.parse_args(["describe", *argv])
    return d.run_describe(args)


def openai_args(api: FakeAPI, out: Path, *extra: str) -> list[str]:
    return [
        "--dataset", "cifar10", "--variant", "long", "--provider", "openai",
        "--model", "gpt-test", "--base-url", api.url, "--api-key-env", KEY_ENV,
        "--out", str(out), "--timeout", "0.5", "--no-progress", *extra,
    ]  # fmt: skip


def class_keys(path: Path) -> list[str]:
    return [key for key in json.loads(path.read_text()) if not key.startswith("_")]


# --------------------------------------------------------------------------------------------
# The OpenAI provider end to end
# --------------------------------------------------------------------------------------------


def test_full_run_survives_each_misbehaviour(api, sleeps, tmp_path, capsys, caplog):
    caplog.set_level("INFO")
    api.script = ["malformed", "429", "500", "hang", "fenced"]
    out = tmp_path / "sets" / "cifar10_long.json"
    assert cli(*openai_args(api, out, "--retries", "5")) == 0

    # airplane: malformed, 429, 500, hang (timeout), then a fenced valid answer.
    assert api.requests == ["airplane"] * 5 + CIFAR10[1:]
    assert all(api.authorised)
    assert len(sleeps) == 3  # after 429, 500 and the timeout; a malformed answer is re-asked
    assert sleeps[0] == 0.0  # Retry-After: 0 honoured
    # Exponential in the attempt number (500 was attempt 2, the timeout 3), jitter in [0.5, 1).
    assert 2.0 <= sleeps[1] < 4.0 and 4.0 <= sleeps[2] < 8.0
    log = caplog.text
    assert "malformed" in log and "HTTP 429" in log and "HTTP 500" in log and "timeout" in log

    data = json.loads(out.read_text())
    assert class_keys(out) == CIFAR10  # dataset order
    prompts = load_descriptions(out, CIFAR10)
    assert [len(p) for p in prompts] == [3] * 10
    validate = getattr(descriptions, "validate_descriptions", None)
    if validate is not None:  # the committed sets' validator accepts the file too
        validate(out, CIFAR10, k=3)
    assert prompts[0][0] == "A photo of a airplane: airplane aspect 0 in a sentence."
    meta = data["_meta"]
    for field in ("dataset", "variant", "k", "written_by", "date", "instruction", "schema"):
        assert meta[field], field
    assert (meta["dataset"], meta["variant"], meta["k"]) == ("cifar10", "long", 3)
    assert meta["model"] == "gpt-test" and meta["provider"] == "openai"
    assert "gpt-test" in meta["written_by"]
    assert meta["instruction"] == d.instruction_text("long", 3)
    assert meta["request"] == 'Class: "{class}" (from the CIFAR-10 dataset)'
    assert date.fromisoformat(meta["date"])
    assert all(data[c]["Hard Negatives"] == [] for c in CIFAR10)
    assert not [p for p in out.parent.iterdir() if p.name != out.name]  # no temp files left

    captured = capsys.readouterr()
    assert "wrote 10 classes" in captured.out
    for text in (out.read_text(), captured.out, captured.err, caplog.text):
        assert KEY not in text


def test_always_malformed_class_stops_and_rerun_resumes(api, sleeps, tmp_path, capsys):
    out = tmp_path / "cifar10_long.json"
    api.always["cat"] = "malformed"
    assert cli(*openai_args(api, out, "--retries", "2")) == 1
    err = capsys.readouterr().err
    assert "'cat'" in err and "3 attempts" in err and "Sure! Here are some" in err
    assert api.requests == ["airplane", "automobile", "bird", "cat", "cat", "cat"]
    assert class_keys(out) == ["airplane", "automobile", "bird"]  # done classes kept
    assert json.loads(out.read_text())["_meta"]["k"] == 3

    api.reset()
    assert cli(*openai_args(api, out)) == 0
    assert api.requests == CIFAR10[3:]  # only the missing classes
    assert class_keys(out) == CIFAR10
    assert len(load_descriptions(out, CIFAR10)) == 10

    api.reset()
    assert cli(*openai_args(api, out)) == 0
    assert api.requests == []  # nothing left to do

    assert cli(*openai_args(api, out, "--force")) == 0
    assert api.requests == CIFAR10


def test_resume_refuses_a_file_written_with_other_settings(api, sleeps, tmp_path, capsys):
    out = tmp_path / "set.json"
    api.k = 2
    assert cli(*openai_args(api, out, "--k", "2")) == 0
    assert [len(p) for p in load_descriptions(out, CIFAR10)] == [2] * 10
    api.reset()
    capsys.readouterr()
    assert cli(*openai_args(api, out, "--k", "3")) == 2
    err = capsys.readouterr().err
    assert "different settings" in err and "k" in err and "--force" in err
    assert api.requests == []

    foreign = tmp_path / "foreign.json"
    foreign.write_text(json.dumps({"cat": good_answer("cat", 3)}))
    assert cli(*openai_args(api, foreign)) == 2
    assert "no _meta" in capsys.readouterr().err
    assert api.requests == []


def test_invalid_entries_in_the_file_are_regenerated(api, sleeps, tmp_path):
    out = tmp_path / "set.json"
    assert cli(*openai_args(api, out)) == 0
    data = json.loads(out.read_text())
    data["dog"]["Fine-grained Descriptions"] = ["only one"]
    out.write_text(json.dumps(data))
    api.reset()
    assert cli(*openai_args(api, out)) == 0
    assert api.requests == ["dog"]
    assert len(json.loads(out.read_text())["dog"]["Fine-grained Descriptions"]) == 3


def test_api_key_never_leaks(api, sleeps, tmp_path, capsys, caplog):
    caplog.set_level("DEBUG")
    out = tmp_path / "set.json"
    api.script = ["500echo"]  # a server error whose message echoes the key
    api.always["dog"] = "401echo"  # a fatal error echoing the key
    with pytest.raises(d.DescribeError) as info:
        d.describe(
            "cifar10",
            d.Backend("gpt-test", base_url=api.url, timeout=0.5, api_key_env=KEY_ENV),
            out=out,
            progress=True,
        )
    exc = info.value
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    assert "'dog'" in str(exc) and "HTTP 401" in str(exc) and "***" in str(exc)
    assert api.requests == ["airplane", *CIFAR10[:6]]
    assert "overloaded for key ***" in caplog.text  # the echoed key was masked in the log

    assert cli(*openai_args(api, out)) == 1  # the CLI path: dog fails again
    captured = capsys.readouterr()
    assert "'dog'" in captured.err
    for leak_site in (str(exc), repr(exc), text, caplog.text, captured.out, captured.err):
        assert KEY not in leak_site
    assert KEY not in out.read_text()
    assert KEY not in repr(d.OpenAIChat("m", KEY, api.url))


def test_timeouts_and_server_errors_exhaust_retries(api, sleeps, tmp_path, capsys):
    api.always["airplane"] = "hang"
    out = tmp_path / "set.json"
    assert cli(*openai_args(api, out, "--retries", "1")) == 1
    err = capsys.readouterr().err
    assert "'airplane'" in err and "timeout" in err and "2 attempts" in err
    assert len(sleeps) == 1
    assert not out.exists()  # nothing was done, nothing written


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"dataset": "imagenet21k"}, "unknown dataset"),
        ({"k": 0}, "k (descriptions per class) must be an integer >= 1"),
        ({"variant": "medium"}, "variant must be one of long, short"),
        ({"provider": "anthropic"}, "provider must be one of openai, local"),
        ({"retries": -1}, "retries must be"),
        ({"timeout": 0.0}, "timeout must be a positive"),
        ({"api_key_env": "FEDTSP_TEST_NO_SUCH_KEY"}, "FEDTSP_TEST_NO_SUCH_KEY holds no API key"),
        ({"dataset": "tinyimagenet", "wnids": "/no/such/wnids.txt"}, "does not exist"),
        ({"wnids": "wnids.txt"}, "only apply to Tiny-ImageNet"),
        ({"base_url": "ftp://example"}, "--base-url must be an http(s) URL"),
    ],
)
def test_bad_inputs_fail_with_one_sentence_before_any_request(
    api, tmp_path, capsys, monkeypatch, change, expected
):
    monkeypatch.delenv("FEDTSP_TEST_NO_SUCH_KEY", raising=False)
    parser = argparse.ArgumentParser()
    d.add_describe_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["describe", *openai_args(api, tmp_path / "x.json")])
    for name, value in change.items():
        setattr(args, name, value)
    assert d.run_describe(args) == 2
    err = capsys.readouterr().err.strip()
    assert expected in err
    assert err.startswith("fedtsp: error: ") and "\n" not in err
    assert api.requests == []
    assert not (tmp_path / "x.json").exists()


def test_argparse_rejects_bad_choices(capsys):
    with pytest.raises(SystemExit):
        cli("--dataset", "cifar10", "--model", "m", "--variant", "medium")
    assert "invalid choice" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# Pieces
# --------------------------------------------------------------------------------------------


def test_parse_answer_accepts_fences_and_prose_and_rejects_bad_shapes():
    entry = good_answer("cat", 3)
    plain = json.dumps(entry)
    for text in (
        plain,
        f"```json\n{plain}\n```",
        f"```\n{plain}```",
        f"Here you go:\n{plain}\nBye",
    ):
        got = d.parse_answer(text, 3)
        assert got["Short Label"] == "cat" and len(got["Fine-grained Descriptions"]) == 3
        assert got["Hard Negatives"] == []
    bad = {
        "": "empty",
        "no json here": "no JSON object",
        "{not: json}": "not valid JSON",
        "[1, 2]": "not a JSON object",
        json.dumps({"Fine-grained Descriptions": ["a", "b", "c"]}): "Short Label",
        json.dumps({"Short Label": "cat"}): "missing or not a list",
        json.dumps({**entry, "Fine-grained Descriptions": ["a", "b"]}): "holds 2 descriptions",
        json.dumps({**entry, "Fine-grained Descriptions": ["a", " ", "c"]}): "empty",
        json.dumps({**entry, "Fine-grained Descriptions": ["a", 2, "c"]}): "non-string",
    }
    for text, reason in bad.items():
        with pytest.raises(d.MalformedAnswer, match=reason):
            d.parse_answer(text, 3)


def test_instruction_covers_the_aspects_and_the_variant():
    long, short = d.instruction_text("long", 3), d.instruction_text("short", 3)
    for text in (long, short):
        assert "appearance" in text and "function or behaviour" in text and "environment" in text
        assert '"Short Label"' in text and '"Fine-grained Descriptions"' in text
    assert "one or two complete sentences" in long and "single short line" in short
    assert "<description 5>" in d.instruction_text("long", 5)
    assert "write 1 fine-grained description," in d.instruction_text("short", 1)
    msgs = d.build_messages(d.ClassSpec("aquarium_fish", "aquarium fish"), "CIFAR-100", "long", 3)
    assert msgs[1]["content"] == 'Class: "aquarium fish" (from the CIFAR-100 dataset)'


def test_backoff_delay_and_retry_after():
    import random

    rng = random.Random(0)
    assert d.backoff_delay(3, retry_after=7.0) == 7.0
    assert d.backoff_delay(0, retry_after=1e9) == providers.MAX_RETRY_AFTER_S
    for attempt in range(12):
        delay = d.backoff_delay(attempt, rng=rng)
        full = min(generate.BACKOFF_CAP_S, generate.BACKOFF_BASE_S * 2**attempt)
        assert 0.5 * full <= delay < full
    assert providers._parse_retry_after("2") == 2.0
    assert providers._parse_retry_after("-5") == 0.0
    assert providers._parse_retry_after("soon") is None
    assert providers._parse_retry_after(None) is None
    assert providers._parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # in the past


def test_tiny_imagenet_classes_from_wnids_and_words(tmp_path, caplog, monkeypatch):
    wnids = [f"n{9_000_000 - i:08d}" for i in range(200)]  # listed in non-sorted order
    folder = tmp_path / "tiny-imagenet-200"
    folder.mkdir()
    (folder / "wnids.txt").write_text("\n".join(wnids) + "\n")
    words = {w: f"thing {i}, stuff" for i, w in enumerate(wnids)}
    words["n00000001"] = "entity"  # words.txt covers more than the 200 classes
    (folder / "words.txt").write_text("".join(f"{w}\t{t}\n" for w, t in words.items()))

    name, title, classes = d.resolve_classes("tiny", wnids=folder)  # words found next to it
    assert (name, title) == ("tinyimagenet", "Tiny-ImageNet")
    assert [c.key for c in classes] == sorted(wnids)
    assert classes[0].name == words[sorted(wnids)[0]]

    only = tmp_path / "wnids.txt"
    only.write_text("\n".join(wnids))
    with caplog.at_level("WARNING"):
        _, _, bare = d.resolve_classes("tinyimagenet", wnids=only)
    assert [c.name for c in bare] == sorted(wnids) and "bare WordNet ids" in caplog.text
    _, _, named = d.resolve_classes("tinyimagenet", wnids=only, class_words=folder / "words.txt")
    assert named == classes

    exact = tmp_path / "words200.txt"
    exact.write_text("".join(f"{w}\tthing {i}\n" for i, w in enumerate(wnids)))
    _, _, from_words = d.resolve_classes("tinyimagenet", class_words=exact)
    assert [c.key for c in from_words] == sorted(wnids)

    # words.txt with more than the 200 classes: the wnids come from a committed set, if any.
    monkeypatch.setattr(describe_classes, "COMMITTED_SETS", tmp_path / "sets")
    with pytest.raises(d.DescribeInputError, match="pass --wnids"):
        d.resolve_classes("tinyimagenet", class_words=folder / "words.txt")
    (tmp_path / "sets").mkdir()
    (tmp_path / "sets" / "tinyimagenet_short.json").write_text(
        json.dumps({"_meta": {}, **{w: good_answer(w, 3) for w in wnids}})
    )
    _, _, from_set = d.resolve_classes("tinyimagenet", class_words=folder / "words.txt")
    assert from_set == classes
    short = tmp_path / "few.txt"
    short.write_text("n01\nn02\n")
    with pytest.raises(d.DescribeInputError, match="holds 2 classes"):
        d.resolve_classes("tinyimagenet", wnids=short)
    _, _, cifar100 = d.resolve_classes("cifar100")
    assert d.ClassSpec("aquarium_fish", "aquarium fish") in cifar100


# --------------------------------------------------------------------------------------------
# The local provider, on a tiny random GPT-2 (the pipeline is tested, not the model)
# --------------------------------------------------------------------------------------------


@pytest.fixture
def tiny_lm(tmp_path: Path) -> Path:
    pytest.importorskip("transformers")
    from tokenizers import ByteLevelBPETokenizer
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    corpus = ['{"Short Label": "cat", "Fine-grained Descriptions": ["a small animal."]}'] * 20
    bpe.train_from_iterator(corpus, vocab_size=300, special_tokens=["<|endoftext|>"])
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token="<|endoftext|>")
    path = tmp_path / "tiny-gpt2"
    tok.save_pretrained(path)
    config = GPT2Config(
        vocab_size=len(tok), n_positions=2048, n_embd=16, n_layer=1, n_head=2,
        eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id,
    )  # fmt: skip
    GPT2LMHeadModel(config).save_pretrained(path)
    return path


def stub_generate(monkeypatch: pytest.MonkeyPatch, path: Path) -> list[dict]:
    """Replace GPT-2's generate by one that appends a valid JSON answer to the prompt."""
    import torch
    from transformers import AutoTokenizer, GPT2LMHeadModel

    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    calls: list[dict] = []

    def generate(self, input_ids, attention_mask=None, **kwargs):
        prompt = tok.decode(input_ids[0])
        name = re.search(r'Class: "(.*?)"', prompt).group(1)
        calls.append({"prompt": prompt, **kwargs})
        answer = tok(json.dumps(good_answer(name, 3)), return_tensors="pt")["input_ids"]
        return torch.cat([input_ids, answer], dim=1)

    monkeypatch.setattr(GPT2LMHeadModel, "generate", generate)
    return calls


def local_args(model: Path, out: Path, *extra: str) -> list[str]:
    return [
        "--dataset", "cifar10", "--provider", "local", "--model", str(model),
        "--out", str(out), "--device", "cpu", "--no-progress", *extra,
    ]  # fmt: skip


def test_local_provider_writes_a_valid_file(tiny_lm, tmp_path, monkeypatch, capsys):
    calls = stub_generate(monkeypatch, tiny_lm)
    out = tmp_path / "local.json"
    assert cli(*local_args(tiny_lm, out, "--variant", "short")) == 0
    assert len(calls) == 10
    assert calls[0]["do_sample"] is False  # greedy
    assert calls[0]["prompt"].endswith("JSON answer:\n")  # no chat template: plain prompt
    assert d.instruction_text("short", 3) in calls[0]["prompt"]
    assert len(load_descriptions(out, CIFAR10)) == 10
    meta = json.loads(out.read_text())["_meta"]
    assert meta["provider"] == "local" and meta["model"] == "tiny-gpt2"
    assert meta["variant"] == "short" and meta["generation"]["decoding"] == "greedy"


def test_local_provider_uses_the_chat_template(tiny_lm, tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_lm, local_files_only=True)
    tok.chat_template = (
        "{% for m in messages %}<<{{ m['role'] }}>>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<<assistant>>{% endif %}"
    )
    tok.save_pretrained(tiny_lm)
    calls = stub_generate(monkeypatch, tiny_lm)
    out = tmp_path / "local.json"
    assert cli(*local_args(tiny_lm, out)) == 0
    assert calls[0]["prompt"].startswith("<<system>>")
    assert calls[0]["prompt"].endswith("<<assistant>>")
    assert '<<user>>Class: "airplane"' in calls[0]["prompt"]


def test_local_provider_random_model_answer_is_reported_as_malformed(tiny_lm, tmp_path, capsys):
    out = tmp_path / "local.json"
    assert cli(*local_args(tiny_lm, out, "--retries", "0", "--max-tokens", "6")) == 1
    err = capsys.readouterr().err
    assert "'airplane'" in err and "no valid answer after 1 attempt;" in err
    assert not out.exists()


def test_local_provider_missing_or_wrong_path(tmp_path, capsys):
    assert cli(*local_args(tmp_path / "nowhere", tmp_path / "o.json")) == 2
    assert "local model directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert cli(*local_args(tmp_path / "empty", tmp_path / "o.json")) == 2
    assert "not a transformers model directory" in capsys.readouterr().err
