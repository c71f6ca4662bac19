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
