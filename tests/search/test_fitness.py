"""Search fitness on shared contexts and with the log-probability objective."""
from __future__ import annotations

import math

import pytest
from conftest import make_tiny_model

from posbias.search.fitness import TeacherForcedFitness
from posbias.tasks.kv import make_kv


@pytest.fixture
def shared_instances():
    return make_kv(n=4, depths=[0.0, 0.5, 1.0], seed=0, split="search", num_keys=6, shared_context=True)


def test_shared_contexts_give_the_same_fitness_with_fewer_forwards(tiny_tokenizer, shared_instances):
    model = make_tiny_model("llama")
    results = {}
    for shared in (True, False):
        fit = TeacherForcedFitness(model, tiny_tokenizer, shared_instances, batch_size=3, chat=False, shared=shared)
        results[shared] = fit.score([0.8, 1.0, 1.4])
        fit.close()
    a, b = results[True], results[False]
    assert a.counts == b.counts and math.isclose(a.logprob_sum, b.logprob_sum, rel_tol=1e-5)
    assert a.forward_passes == 4 * 2 and b.forward_passes == 4 * 1  # 4 contexts: prefill + 1 batch each
    assert a.complete and b.complete


def test_logprob_objective_value_bound_and_pruning(tiny_tokenizer, shared_instances):
    model = make_tiny_model("qwen2")
    fit = TeacherForcedFitness(model, tiny_tokenizer, shared_instances, batch_size=3, chat=False,
                               objective="logprob")
    full = fit.score([1.0, 1.2, 0.9])
    per_depth = {d: lp / full.counts[d][1] for d, lp in full.logprob_by_depth.items()}
    assert math.isclose(full.value, sum(per_depth.values()) / 3, rel_tol=1e-9)
    assert full.key == (full.value, full.accuracy) and full.value < 0
    assert math.isclose(full.upper_bound, full.value, rel_tol=1e-9)  # complete: the bound is the value
    # a threshold above what this genome can reach prunes it after the first chunk (one context)
    pruned = fit.score([1.0, 1.2, 0.9], threshold=full.value / 10)
    assert pruned.pruned and pruned.n_scored == 3 and pruned.upper_bound >= full.value
    resumed = fit.score([1.0, 1.2, 0.9], partial=pruned)
    assert resumed.complete and math.isclose(resumed.value, full.value, rel_tol=1e-6)
    fit.close()
    with pytest.raises(ValueError, match="unknown objective"):
        TeacherForcedFitness(model, tiny_tokenizer, shared_instances, objective="perplexity")
