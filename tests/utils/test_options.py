"""The shared refusal of unknown option names."""
import pytest

from posbias.utils.options import refuse_unknown


def test_unknown_names_are_refused_with_the_closest_known_name_and_the_known_ones():
    known = {"rope_theta", "alpha_init", "beta_init"}
    refuse_unknown({"rope_theta": 1}, known, "model option")  # all known: nothing raised
    with pytest.raises(ValueError) as e:
        refuse_unknown({"rope_thet": 1, "zzz": 2}, known, "model option")
    assert str(e.value) == ("unknown model option(s) rope_thet, zzz (did you mean: rope_thet -> rope_theta?); "
                            "known: alpha_init, beta_init, rope_theta")


def test_typed_options_take_the_type_of_their_field():
    from posbias.bam import BamConfig
    from posbias.training.config import TrainConfig
    from posbias.utils.options import field_types, parse_typed_options

    train = field_types(TrainConfig)
    got = parse_typed_options(["probe_tasks=passkey,niah", "lr=3", "betas=0.9,0.99", "prior_lr=none", "ssmax=yes",
                               "corpus=a.txt", "log-every=5", "model_overrides={\"rope_theta\": 100}"],
                              train, "train-opt", "training option")
    assert got == {"probe_tasks": ("passkey", "niah"), "lr": 3.0, "betas": (0.9, 0.99), "prior_lr": None,
                   "ssmax": True, "corpus": ["a.txt"], "log_every": 5, "model_overrides": {"rope_theta": 100}}
    assert type(got["lr"]) is float and type(got["log_every"]) is int
    # a single probe task is a list of one, not a string; a number-looking string stays a string
    assert parse_typed_options(["probe_tasks=niah", "tokenizer=1234"], train, "train-opt", "training option") == \
        {"probe_tasks": ("niah",), "tokenizer": "1234"}
    model = parse_typed_options(["rope_theta=10000", "num_key_value_heads=2", "ffn_chunk_size=none",
                                 "ggd_theta_alpha=1,2"], field_types(BamConfig), "model-opt", "model option")
    assert model == {"rope_theta": 10000.0, "num_key_value_heads": 2, "ffn_chunk_size": None,
                     "ggd_theta_alpha": [1.0, 2.0]}  # an argument without a declared type: read by its look
    for bad, match in ((["steps=1.5"], "--train-opt steps must be an integer, got '1.5'"),
                       (["betas=0.9"], "--train-opt betas takes 2 comma-separated values"),
                       (["ssmax=maybe"], "--train-opt ssmax must be true or false"),
                       (["stepz=1"], r"unknown training option\(s\) stepz \(did you mean: stepz -> steps\?\)"),
                       (["steps"], "--train-opt expects key=value")):
        with pytest.raises(ValueError, match=match):
            parse_typed_options(bad, train, "train-opt", "training option")


def test_a_probe_tasks_string_of_an_older_run_reads_as_a_list():
    from posbias.training.config import TrainConfig, typed_train_options

    assert TrainConfig(probe_tasks="passkey, niah").probe_tasks == ("passkey", "niah")
    assert TrainConfig(probe_tasks=["niah"]).to_json()["probe_tasks"] == ["niah"]
    assert typed_train_options({"probe_tasks": "passkey,niah", "lr": 1.0}) == \
        {"probe_tasks": ["passkey", "niah"], "lr": 1.0}


def test_parse_depths_every():
    from posbias.tasks import depth_to_index
    from posbias.utils.options import parse_depths

    assert parse_depths("0,0.5,1") == [0.0, 0.5, 1.0]
    depths = parse_depths("every:20")
    assert len(depths) == 20 and depths[0] == 0.0 and depths[-1] == 1.0
    assert [depth_to_index(d, 20) for d in depths] == list(range(20))
    assert [depth_to_index(d, 30) for d in parse_depths("every:30")] == list(range(30))
    for bad in ("every:1", "every:x", "every:"):
        with pytest.raises(ValueError, match="every:N"):
            parse_depths(bad)
