"""`corpus export`: every format and file format, read back with `datasets` offline; splits per conversation."""

from __future__ import annotations

import errno
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import orjson
import pyarrow.parquet as pq
import pytest

from corpus_builder.assemble import build_corpus
from corpus_builder.assemble.plan import TargetTokens
from corpus_builder.errors import CorpusError
from corpus_builder.export import EXPORT_FORMATS, FILE_FORMATS, export_corpus, write
from corpus_builder.export.formats import TRAINER_FORMATS, specforge_problems
from corpus_builder.layout import Corpus
from corpus_builder.recipe import load_recipe
from corpus_builder.records import Conversation, Provenance
from corpus_builder.sources import iter_file
from corpus_builder.tokens import TemplateRenderer
from tests.support.chats import synthetic_chats
from tests.support.corpora import write_corpus

RECIPE = """\
name: export
target: {{model: tiny-target, tokenizer: {tokenizer}}}
sources:
  - {{name: log, kind: replay, path: log.jsonl, task: chat, license: MIT}}
split: {{validation_fraction: 0.3, seed: 2}}
output:
  dir: out
  exports:
    - {{format: speculators-tokens, file_format: parquet}}
    - {{format: sharegpt, file_format: jsonl.zst}}
"""


def log_rows() -> list[dict]:
    return synthetic_chats(30, max_turns=3, system="Be brief.", system_every=4,
                           question=lambda i, turn: f"question {i}.{turn}",
                           answer=lambda i, turn: f"answer {i}.{turn}",
                           reasoning=lambda i, turn: f"reasoning {i}.{turn}")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Corpus:
    directory = tmp_path_factory.mktemp("export")
    (directory / "log.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in log_rows()))
    (directory / "recipe.yaml").write_text(RECIPE.format(tokenizer=tiny_model_dir))
    result = build_corpus(load_recipe(directory / "recipe.yaml"))
    assert [(e.format, e.file_format) for e in result.exports] == [("speculators-tokens", "parquet"),
                                                                   ("sharegpt", "jsonl.zst")]
    return Corpus.open(result.out_dir)


def load(path: Path):
    from datasets import load_dataset

    kind = "parquet" if path.suffix == ".parquet" else "json"
    return load_dataset(kind, data_files=str(path), split="train")


def assistant_turns(conversations: list[Conversation]) -> int:
    return sum(m.role == "assistant" for c in conversations for m in c.messages)


def test_every_format_named_for_the_recipe_and_the_cli_is_one_record() -> None:
    assert tuple(TRAINER_FORMATS) == EXPORT_FORMATS
    assert all(name == record.name for name, record in TRAINER_FORMATS.items())


@pytest.mark.parametrize("file_format", FILE_FORMATS)
@pytest.mark.parametrize("fmt", EXPORT_FORMATS)
def test_every_export_loads_with_datasets(corpus: Corpus, tmp_path: Path, fmt: str, file_format: str,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from datasets import List, Value

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    report = export_corpus(corpus, fmt, tmp_path / fmt, file_format=file_format)
    assert set(report.files) == {"train", "validation"}
    ids_by_split = {}
    for split, info in report.files.items():
        path = info.path
        assert path == tmp_path / fmt / f"{split}.{file_format}"
        conversations = list(corpus.iter_conversations(split=split))
        dataset = load(path)
        assert len(dataset) == info.rows
        if file_format == "parquet":  # the record's schema is the file's
            assert pq.read_schema(path).remove_metadata() == TRAINER_FORMATS[fmt].schema
        features = dataset.features
        if fmt == "speculators-tokens":
            assert len(dataset) == assistant_turns(conversations)
            assert isinstance(features["input_ids"], List)
            assert features["input_ids"].feature in (Value("int32"), Value("int64"))
            row = dataset[0]
            assert len(row["input_ids"]) == len(row["loss_mask"]) and set(row["loss_mask"]) == {0, 1}
            ids_by_split[split] = {row_id.split("/")[0] for row_id in dataset["id"]}
            continue
        column = "messages" if fmt == "messages" else "conversations"
        turn_feature = features[column]
        assert isinstance(turn_feature, List) and isinstance(turn_feature.feature, dict), features
        assert len(dataset) == len(conversations) - info.left_out
        ids_by_split[split] = set(dataset["id"])
    # No conversation contributes rows to both splits.
    assert not ids_by_split["train"] & ids_by_split["validation"]


def test_conversation_formats_carry_reasoning_apart(corpus: Corpus, tmp_path: Path) -> None:
    by_id = {c.id: c for c in corpus.iter_conversations()}
    export_corpus(corpus, "speculators", tmp_path / "s")
    for line in (tmp_path / "s/train.jsonl").read_bytes().splitlines():
        row = orjson.loads(line)
        source = by_id[row["id"]]
        assert [t["role"] for t in row["conversations"]] == [m.role for m in source.messages]
        for turn, message in zip(row["conversations"], source.messages, strict=True):
            assert turn["content"] == message.content and "<think>" not in turn["content"]
            assert turn["reasoning_content"] == message.reasoning
            assert turn["reasoning_content"] is None or turn["role"] == "assistant"
    export_corpus(corpus, "messages", tmp_path / "m")
    first = orjson.loads((tmp_path / "m/train.jsonl").read_bytes().splitlines()[0])
    assert set(first) == {"id", "source", "messages", "tools"} and first["source"] == "log"
    assert first["tools"] is None and all(turn["tool_calls"] is None for turn in first["messages"])


def test_sharegpt_round_trips_through_the_readers(corpus: Corpus, tmp_path: Path) -> None:
    export_corpus(corpus, "sharegpt", tmp_path, file_format="jsonl.zst")
    back = [c for c in iter_file(tmp_path / "train.jsonl.zst") if isinstance(c, Conversation)]
    original = {tuple((m.role, m.content, m.reasoning) for m in c.messages)
                for c in corpus.iter_conversations(split="train")}
    assert {tuple((m.role, m.content, m.reasoning) for m in c.messages) for c in back} == original


def test_specforge_export_passes_its_rules(corpus: Corpus, tmp_path: Path) -> None:
    report = export_corpus(corpus, "specforge", tmp_path)
    assert report.skipped == {}
    rows = [orjson.loads(line) for split in report.files for line in (tmp_path / f"{split}.jsonl").read_bytes()
            .splitlines()]
    assert len(rows) == corpus.manifest.conversations
    assert all(specforge_problems(row) == [] for row in rows)


def test_specforge_rules() -> None:
    good = {"id": "a", "conversations": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                                         {"role": "assistant", "content": "a", "reasoning_content": "r"}]}
    assert specforge_problems(good) == []
    cases = {
        "expected 'assistant'": [{"role": "user", "content": "u"}, {"role": "user", "content": "u"}],
        "empty or non-string": [{"role": "user", "content": "u"}, {"role": "assistant", "content": " "}],
        "think marker": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "x</think>y"}],
        "not an assistant turn": [{"role": "user", "content": "u", "reasoning_content": "r"},
                                  {"role": "assistant", "content": "a"}],
        "expected 'user'": [{"role": "assistant", "content": "a"}],
    }
    for needle, turns in cases.items():
        problems = specforge_problems({"id": "a", "conversations": turns})
        assert any(needle in p for p in problems), (needle, problems)
    assert specforge_problems({"id": "", "conversations": []}) == ["id is not a non-empty string",
                                                                    "conversations is not a non-empty list"]


def test_export_command(corpus: Corpus, tmp_path: Path) -> None:
    completed = subprocess.run([sys.executable, "-m", "corpus_builder", "export", str(corpus.root), "--format",
                                "speculators-tokens", "--out", str(tmp_path / "t")], capture_output=True, text=True)
    assert completed.returncode == 0, completed.stderr
    assert "train" in completed.stdout and (tmp_path / "t/train.jsonl").exists()
    bad = subprocess.run([sys.executable, "-m", "corpus_builder", "export", str(tmp_path), "--format", "messages",
                          "--out", str(tmp_path / "x")], capture_output=True, text=True)
    assert bad.returncode == 2 and "manifest.json is missing" in bad.stderr


def test_recipe_exports_are_validated(tmp_path: Path) -> None:
    from corpus_builder.errors import CorpusError

    (tmp_path / "log.jsonl").write_bytes(orjson.dumps(log_rows()[0]) + b"\n")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE.replace("tokenizer: {tokenizer}", "").replace("{{", "{").replace("}}", "}")
                      .replace("parquet}", "feather}"))
    with pytest.raises(CorpusError) as problem:
        load_recipe(recipe)
    details = "\n".join(problem.value.details)
    assert "output.exports[0].format" in details and "set target.tokenizer" in details
    assert "output.exports[0].file_format" in details


def corpus_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "corpus_builder", *args], capture_output=True, text=True)


def test_export_refuses_an_out_that_is_a_file_an_input_or_inside_the_corpus(corpus: Corpus, tmp_path: Path,
                                                                            tiny_model_dir: Path) -> None:
    existing = tmp_path / "taken.jsonl"
    existing.write_text("keep me")
    refused = corpus_cli("export", str(corpus.root), "--format", "messages", "--out", str(existing))
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert f"{existing}: --out: exists and is not a directory" in refused.stderr
    assert existing.read_text() == "keep me"
    tokenizer = tmp_path / "tokenizer"  # a copy: a missing guard must not write into the shared tiny model
    tokenizer.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (tokenizer / name).write_bytes((tiny_model_dir / name).read_bytes())
    before = {path: path.stat().st_mtime_ns for path in (*tokenizer.iterdir(), *corpus.root.rglob("*"))}
    for out, problem in ((tokenizer, "this run reads"), (corpus.root / "exported", "inside the built corpus")):
        with pytest.raises(CorpusError, match=problem):
            export_corpus(corpus, "speculators-tokens", out, tokenizer=tokenizer)
    # a file of a split that resolves into the corpus is refused too, not written through
    (tmp_path / "out").mkdir()
    (tmp_path / "out/validation.jsonl").symlink_to(corpus.root / "manifest.json")
    with pytest.raises(CorpusError, match=r"validation\.jsonl: --out: inside the built corpus"):
        export_corpus(corpus, "messages", tmp_path / "out")
    assert {path: path.stat().st_mtime_ns for path in (*tokenizer.iterdir(), *corpus.root.rglob("*"))} == before
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["validation.jsonl"]


def test_an_export_that_fails_leaves_nothing_written(corpus: Corpus, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / ".validation.jsonl.partial").mkdir()  # in the way of the second split's file
    with pytest.raises(CorpusError, match=re.escape(f"{out / 'validation.jsonl'}: cannot write")):
        export_corpus(corpus, "messages", out)
    assert [p.name for p in out.iterdir()] == [".validation.jsonl.partial"]  # train.jsonl neither half nor whole

    def full_disk(self: object, rows: list) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(write._JsonlSink, "write", full_disk)
    fresh = tmp_path / "new" / "out"
    with pytest.raises(CorpusError, match=re.escape(f"{fresh / 'train.jsonl'}: cannot write: No space left on device")):
        export_corpus(corpus, "messages", fresh)
    assert not (tmp_path / "new").exists()  # the directories the export made are gone with its files


def as_generated(conversation: Conversation, renderer: TemplateRenderer) -> Conversation:
    """``conversation`` as a generated row: each assistant turn with the ids the target's server would have
    served (its prompt tokenized alone, then the turn's text through the end-of-turn token)."""
    turns = []
    for j, message in enumerate(conversation.messages):
        if message.role == "assistant":
            prompt = renderer.render_prompt(conversation, j)
            turn = renderer.render_through(conversation, j)[len(prompt):]
            turn = turn[:turn.index(renderer.eos_token) + len(renderer.eos_token)]
            prompt_ids, turn_ids = renderer.encode([prompt, turn])
            turns.append({"message_index": j, "endpoint": "http://127.0.0.1:1/v1", "finish_reason": "stop",
                          "prompt_token_ids": prompt_ids, "token_ids": turn_ids})
    generation = {"turns": turns, "enable_thinking": True}
    return replace(conversation, origin="generated", provenance=Provenance.from_json({"generation": generation}))


@pytest.fixture(scope="module")
def generated_corpus(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Corpus:
    """A corpus of generated rows whose served ids are the tiny model's tokenizer's."""
    directory = tmp_path_factory.mktemp("generated")
    (directory / "log.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in log_rows()[:6]))
    (directory / "recipe.yaml").write_text(RECIPE.format(tokenizer=tiny_model_dir))
    recipe = load_recipe(directory / "recipe.yaml")
    tokens = TargetTokens.for_recipe(recipe)
    assert tokens.renderer is not None
    rows = [as_generated(c, tokens.renderer) for c in iter_file(directory / "log.jsonl") if isinstance(c, Conversation)]
    staging = directory / "corpus"
    staging.mkdir()
    write_corpus(iter(rows), recipe, staging, tokens)
    return Corpus.open(staging)


def small_tokenizer(directory: Path, template_from: Path) -> Path:
    """A byte-level BPE of about 300 entries with the tiny model's special tokens and chat template."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(["question answer reasoning"] * 10, trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tokenizer.add_special_tokens([AddedToken(text, special=True, normalized=False)
                                  for text in ("<|im_start|>", "<|im_end|>", "<|endoftext|>")])
    tokenizer.add_tokens([AddedToken("<think>", normalized=False), AddedToken("</think>", normalized=False)])
    directory.mkdir()
    tokenizer.save(str(directory / "tokenizer.json"))
    for name in ("tokenizer_config.json", "chat_template.jinja"):
        (directory / name).write_bytes((template_from / name).read_bytes())
    return directory


def test_token_rows_on_another_tokenizer_than_the_served_ids_are_refused(generated_corpus: Corpus, tmp_path: Path,
                                                                        tiny_model_dir: Path) -> None:
    other = small_tokenizer(tmp_path / "small", tiny_model_dir)
    served_size = TemplateRenderer(tiny_model_dir).tokenizer.get_vocab_size(with_added_tokens=True)
    other_size = TemplateRenderer(other).tokenizer.get_vocab_size(with_added_tokens=True)
    assert other_size < served_size
    out = tmp_path / "out"
    for command in (["export", "--format", "speculators-tokens", "--out", str(out)],
                    ["vocab", "--size", "50", "--out", str(tmp_path / "token_freq.npy")]):
        refused = corpus_cli(command[0], str(generated_corpus.root), *command[1:], "--tokenizer", str(other))
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
        assert "served token id" in refused.stderr and f"{other_size:,} entries of the tokenizer {other}" in \
            refused.stderr and f"{tiny_model_dir.resolve()} ({served_size:,} entries)" in refused.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["small"]  # neither the export nor the file was written
    export_corpus(generated_corpus, "speculators-tokens", out)  # on the target's own tokenizer: the served ids as is
    rows = [orjson.loads(line) for line in (out / "train.jsonl").read_bytes().splitlines()]
    assert rows and max(max(row["input_ids"]) for row in rows) < served_size


def test_an_empty_corpus_is_neither_exported_nor_counted(tmp_path: Path, tiny_model_dir: Path) -> None:
    (tmp_path / "log.jsonl").write_bytes(b"".join(orjson.dumps({"messages": [{"role": "user", "content": f"q {i}"}]})
                                                  + b"\n" for i in range(3)))  # no assistant turn: all dropped
    (tmp_path / "recipe.yaml").write_text(RECIPE.format(tokenizer=tiny_model_dir))
    empty = build_corpus(load_recipe(tmp_path / "recipe.yaml"), allow_empty=True)  # asked for: its exports may be empty
    assert empty.manifest.conversations == 0 and len(empty.exports) == 2
    out, frequencies = tmp_path / "exported", tmp_path / "token_freq.npy"
    for command, problem in ((["export", "--format", "messages", "--out", str(out)],
                              "the corpus holds no conversations"),
                             (["vocab", "--size", "50", "--out", str(frequencies)], "no supervised tokens to count")):
        refused = corpus_cli(command[0], str(empty.out_dir), *command[1:])
        assert refused.returncode == 2 and f"{empty.out_dir}: {problem}" in refused.stderr, refused.stderr
    assert not out.exists() and not frequencies.exists()


@pytest.mark.parametrize("tokenizer", ["Org/Model-1B", "missing-dir"])
def test_export_names_a_tokenizer_that_is_no_directory(corpus: Corpus, tmp_path: Path, tokenizer: str) -> None:
    """The check `corpus vocab` makes: a Hub id or a mistyped path read as "no chat template"."""
    completed = corpus_cli("export", str(corpus.root), "--format", "speculators-tokens", "--out", str(tmp_path / "out"),
                           "--tokenizer", tokenizer)
    assert completed.returncode == 2
    assert completed.stderr.startswith(f"error: {tokenizer}: --tokenizer: no such directory"), completed.stderr
    assert ("reads like a Hub model id" in completed.stderr) is (tokenizer == "Org/Model-1B")
    assert not (tmp_path / "out").exists()
