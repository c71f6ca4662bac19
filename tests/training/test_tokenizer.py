import json

import pytest

from posbias.training import TrainConfig, train
from posbias.training.tokenizer import parse_bpe_spec, resolve_tokenizer_spec, train_bpe_tokenizer

TEXTS = ["The grass is green. The sky is blue. The pass key is 40213. Remember it."] * 5 + \
        ["Here we go. There and back again. Question: who wrote the document?"] * 5


def test_parse_bpe_spec():
    assert parse_bpe_spec("bpe:1024") == 1024
    assert parse_bpe_spec("BPE-512") == 512
    assert parse_bpe_spec(None) is None and parse_bpe_spec("/some/folder") is None
    with pytest.raises(ValueError, match="at least"):
        parse_bpe_spec("bpe:100")


def test_bpe_splits_digits_round_trips_and_reloads(tmp_path):
    from transformers import AutoTokenizer

    tok = train_bpe_tokenizer(TEXTS, 320, tmp_path / "tok")
    assert len(tok) <= 320 and tok.eos_token == "<|endoftext|>" and tok.pad_token_id != tok.eos_token_id
    pieces = tok.tokenize(" The pass key is 98765.")
    assert [p for p in pieces if p.isdigit()] == list("98765")  # one token per digit
    text = "Unseen bytes: é, ß, 漢字 and 12345!"
    assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text  # byte fallback, lossless
    again = AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
    assert again(text)["input_ids"] == tok(text)["input_ids"]


def test_resolve_spec_trains_once_and_is_deterministic(tmp_path):
    assert resolve_tokenizer_spec("/x/y", TEXTS, tmp_path / "a") == "/x/y"
    a = resolve_tokenizer_spec("bpe:330", TEXTS, tmp_path / "a")
    b = resolve_tokenizer_spec("bpe:330", TEXTS, tmp_path / "b")
    assert json.loads((tmp_path / "a" / "tokenizer.json").read_text())["model"]["vocab"] == \
        json.loads((tmp_path / "b" / "tokenizer.json").read_text())["model"]["vocab"]
    mtime = (tmp_path / "a" / "tokenizer.json").stat().st_mtime_ns
    assert resolve_tokenizer_spec("bpe:330", ["other text"], tmp_path / "a") == a  # reused, not retrained
    assert (tmp_path / "a" / "tokenizer.json").stat().st_mtime_ns == mtime and b != a


def test_trainer_with_bpe_tokenizer(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS * 4))
    cfg = TrainConfig(out=str(tmp_path / "run"), steps=2, context=320, batch_size=2, warmup_steps=1,
                      model_overrides=dict(num_hidden_layers=1, hidden_size=32, num_attention_heads=2,
                                           intermediate_size=64),
                      corpus=[str(corpus)], tokenizer="bpe:320", passkey_rate=0.5, progress=False)
    final = train(cfg)
    model_cfg = json.loads((final / "config.json").read_text())
    assert model_cfg["vocab_size"] == 320  # rounded up to a multiple of 64 from 320 tokens
    assert (tmp_path / "run" / "tokenizer" / "tokenizer.json").exists() and (final / "tokenizer.json").exists()


def test_a_truncated_training_tokenizer_is_one_line_naming_its_file(tmp_path, tiny_tokenizer):
    from typer.testing import CliRunner

    from posbias.cli.main import app

    tiny_tokenizer.save_pretrained(tmp_path / "tok")
    text = (tmp_path / "tok" / "tokenizer.json").read_text()
    (tmp_path / "tok" / "tokenizer.json").write_text(text[: len(text) // 2])
    r = CliRunner().invoke(app, ["train", "--tokenizer", str(tmp_path / "tok"), "--steps", "1", "--out",
                                 str(tmp_path / "run")])
    lines = r.output.strip().splitlines()
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert f"{tmp_path / 'tok' / 'tokenizer.json'}: not valid JSON" in lines[-1]
    assert not (tmp_path / "run").exists()
