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
