"""experiments/fixes-qwen-gemma/sliding_window.py: factors by layer kind on a sliding-window model."""
from __future__ import annotations

from conftest import load_experiment, make_tiny_tokenizer, make_variant_model

from posbias.patching.rope_scaling import save_factors_file


def test_rows_split_the_factors_by_layer_kind(tmp_path):
    exp = load_experiment("fixes-qwen-gemma", "sliding_window")
    model = make_variant_model("gemma3")  # sliding, full, sliding, full; window 4
    path = tmp_path / "f.json"
    save_factors_file(path, factors=[0.5, 1.0, 0.7, 1.0])  # below 1 on the sliding layers only
    records = exp.measure(model, make_tiny_tokenizer(), {"lpes": str(path)}, [256], n=1)

    def logprobs(row):
        return [r["logprob"] for r in records if r["row"] == row]

    assert len(logprobs("none")) == len(exp.DEPTHS)
    assert logprobs("lpes, full layers") == logprobs("none")  # factors of 1 there: the model itself
    assert logprobs("lpes, sliding layers") == logprobs("lpes")
    assert logprobs("lpes") != logprobs("none")
    table = exp.table(records)
    assert table.count("/3) |") == 4 and "| lpes, sliding layers |" in table


def test_masked_factors_files_apply_as_the_rows_do(tmp_path):
    import torch

    from posbias.methods import apply_method
    from posbias.patching.rope_scaling import load_factors_file

    exp = load_experiment("fixes-qwen-gemma", "sliding_window")
    model = make_variant_model("gemma3")
    path = tmp_path / "f.json"
    save_factors_file(path, factors=[0.5, 0.8, 0.7, 1.2])
    written = exp.write_masked_files(model, {"lpes": str(path)}, tmp_path)
    assert [p.name for p in written] == ["lpes_sliding_layers.json", "lpes_full_layers.json"]
    assert load_factors_file(written[0])["factors"] == [0.5, 1.0, 0.7, 1.0]
    assert load_factors_file(written[1])["factors"] == [1.0, 0.8, 1.0, 1.2]
    ids = torch.arange(3, 40)[None]
    row = exp.variants(model, {"lpes": str(path)})["lpes, full layers"]
    with torch.no_grad(), row(model):
        expected = model(input_ids=ids).logits
    with torch.no_grad(), apply_method(model, "lpes", factors=str(written[1])):
        assert torch.equal(model(input_ids=ids).logits, expected)
