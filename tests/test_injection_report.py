"""Tests for companion.experiments.injection_report: the scoring and statistics against independent
computations (brute force, exact sums, simulation), bad input, and the GPU config's code path on a
tiny random Llama with a chat template, checked against a direct hooked injection."""

from __future__ import annotations

import copy
import itertools
import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from companion.experiments import injection_report as ir


# ------------------------------------------------------------------------------ scoring
def test_accuracy_trials_is_argmax_equals_target():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(3, 5, 4))
    t = np.array([0, 1, 2, 3, 0])
    got = ir.accuracy_trials(x, t)
    want = np.array([[max(range(4), key=lambda o: x[i, j, o]) == t[j] for j in range(5)] for i in range(3)])
    assert got.shape == (3, 5) and np.array_equal(got, want)


def test_accuracy_is_exactly_chance_for_a_model_that_ignores_the_injection():
    # balanced design: every set is shown with every target; a constant answer is right once in k
    k, n_sets = 4, 6
    rng = np.random.default_rng(0)
    rows = []
    for _ in range(n_sets):
        row = rng.normal(size=k)
        rows += [row] * k
    target = np.tile(np.arange(k), n_sets)
    assert ir.accuracy_trials(np.array(rows), target).mean() == pytest.approx(1 / k)


def test_yes_probability():
    lp = np.log(np.array([[0.3, 0.1], [0.02, 0.08]]))
    np.testing.assert_allclose(ir.yes_probability(lp), [0.75, 0.2])
    with pytest.raises(ValueError):
        ir.yes_probability(np.zeros(3))


@pytest.mark.parametrize("args", [(np.zeros((2, 3)), [0, 1, 2]), (np.zeros((2, 3)), [0, 3]),
                                  (np.zeros((2, 3)), [0.5, 1.0]), (np.zeros(3), [0])])
def test_accuracy_trials_rejects_bad_input(args):
    with pytest.raises(ValueError):
        ir.accuracy_trials(*args)


# ------------------------------------------------------------------------------ statistics
def test_binomial_tail_equals_exact_sum():
    n, p = 13, 0.25
    for x in range(n + 1):
        want = sum(math.comb(n, j) * p**j * (1 - p) ** (n - j) for j in range(x, n + 1))
        assert float(ir.binomial_tail(x, n, p)) == pytest.approx(want, rel=1e-10)


@pytest.mark.parametrize("bad", [dict(successes=5, n=4, p=0.5), dict(successes=1, n=4, p=1.0),
                                 dict(successes=0.5, n=4, p=0.5), dict(successes=1, n=0, p=0.5)])
def test_binomial_tail_rejects_bad_input(bad):
    with pytest.raises((TypeError, ValueError)):
        ir.binomial_tail(**bad)


def _holm_brute(p, alpha):
    """Holm as the closed test of Bonferroni intersections: reject H_i iff every subset holding i rejects."""
    m = len(p)
    out = []
    for i in range(m):
        ok = True
        for r in range(1, m + 1):
            for sub in itertools.combinations(range(m), r):
                if i in sub and min(p[j] for j in sub) > alpha / len(sub):
                    ok = False
        out.append(ok)
    return np.array(out)


def test_holm_equals_the_closed_bonferroni_test():
    rng = np.random.default_rng(3)
    for _ in range(200):
        p = rng.uniform(0, 0.08, size=rng.integers(1, 6))
        assert np.array_equal(ir.holm(p, 0.05), _holm_brute(list(p), 0.05))


def test_holm_controls_the_familywise_error_by_simulation():
    # 10 true nulls with strongly dependent p-values (a shared factor): FWER <= 0.05
    rng = np.random.default_rng(4)
    from scipy.stats import norm
    z = 0.7 * rng.normal(size=(20000, 1)) + math.sqrt(1 - 0.49) * rng.normal(size=(20000, 10))
    p = norm.sf(z)
    fwer = np.mean([ir.holm(row, 0.05).any() for row in p])
    assert fwer <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / 20000)


@pytest.mark.parametrize("bad", [[], [0.1, 1.2], [[0.1]]])
def test_holm_rejects_bad_input(bad):
    with pytest.raises(ValueError):
        ir.holm(bad)


def test_hierarchical_interval_matches_a_loop_bootstrap():
    rng = np.random.default_rng(5)
    x = (rng.uniform(size=(4, 9)) < 0.4).astype(float)
    m, lo, hi = ir.hierarchical_interval(x, 0.9, n_boot=500, seed=7)
    g = np.random.default_rng(7)
    di = g.integers(0, 4, size=(500, 4))
    ti = g.integers(0, 9, size=(500, 9))
    boots = [x[np.ix_(di[b], ti[b])].mean() for b in range(500)]
    assert m == pytest.approx(x.mean())
    assert lo == pytest.approx(np.quantile(boots, 0.05)) and hi == pytest.approx(np.quantile(boots, 0.95))


@pytest.mark.parametrize("bad", [dict(correct=np.zeros((2, 1))), dict(correct=np.zeros(5)),
                                 dict(correct=np.zeros((2, 3)), level=1.0),
                                 dict(correct=np.zeros((2, 3)), n_boot=2)])
def test_hierarchical_interval_rejects_bad_input(bad):
    with pytest.raises((TypeError, ValueError)):
        ir.hierarchical_interval(**bad)


def test_min_detectable_has_the_stated_power_by_simulation():
    n, chance, m = 64, 0.25, 10
    p1 = ir.min_detectable(n, chance, 0.05, m, 0.8)
    # the critical count, found by exact sums
    tail = lambda c, p: sum(math.comb(n, j) * p**j * (1 - p) ** (n - j) for j in range(c, n + 1))  # noqa: E731
    c = next(c for c in range(n + 1) if tail(c, chance) <= 0.05 / m)
    rng = np.random.default_rng(6)
    hits = rng.binomial(n, p1, size=40000) >= c
    assert hits.mean() == pytest.approx(0.8, abs=0.01)
    assert (rng.binomial(n, p1 - 0.03, size=40000) >= c).mean() < 0.8
    assert chance < p1 < 1


def test_min_detectable_and_raw_to_alpha_reject_bad_input():
    with pytest.raises(ValueError):
        ir.min_detectable(10, 1.5)
    with pytest.raises((TypeError, ValueError)):
        ir.min_detectable(0, 0.5)
    with pytest.raises(ValueError):
        ir.raw_to_alpha(5.0, 0.0)
    assert ir.raw_to_alpha(5.0, 2.0) == 2.5


def test_config_validation():
    for bad in [dict(k=1), dict(k=11), dict(scales=(2.0, 1.0)), dict(unit="norm"), dict(strength_ratio=1.0),
                dict(layers=()), dict(concepts=("nothing",)), dict(n_det=0)]:
        with pytest.raises((TypeError, ValueError)):
            replace(ir.InjectionReportExperiment(), **bad).validate()
    ir.GPU_CONFIG.validate()
    assert ir.GPU_CONFIG.k == 10 and ir.GPU_CONFIG.unit == "raw" and 3 in ir.GPU_CONFIG.layers


def test_task_table_on_synthetic_arrays():
    k, L = 4, 3
    rng = np.random.default_rng(8)
    target = np.tile(np.arange(k), 4)
    loc = rng.normal(size=(2, L, 1, target.size, k))
    loc[:, 1, 0, np.arange(target.size), target] += 10.0           # layer index 1 always right
    arrays = dict(concept_loc=loc, loc_target=target, layers=np.array([0, 2, 5]), scales=np.array([1.0]))
    tab = ir.task_table(arrays, "localisation", n_boot=200)
    assert tab["layer"].tolist() == [0, 2, 5] and tab["chance"][0] == 0.25
    assert tab["accuracy"][1] == 1.0 and tab["holm"][1] and tab["p"][1] == pytest.approx(0.25**32)
    assert tab["n"][0] == 32 and not tab["holm"][0] and tab["lo"][1] == 1.0
    with pytest.raises(ValueError):
        ir.task_table(arrays, "naming")
    with pytest.raises(ValueError):
        ir.task_table(arrays, "localisation", group="split")


# ------------------------------------------------------------------------------ the tiny run
_TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }}\n{% endfor %}"
             "{% if add_generation_prompt %}<assistant> {% endif %}")


@pytest.mark.slow
def test_gpu_config_code_path_on_a_tiny_chat_llama():
    from tiny_transformers import minilm_tokenizer, tiny_transformer

    from companion.transformers import readout, stream

    tok = copy.deepcopy(minilm_tokenizer())
    tok.chat_template = _TEMPLATE
    m = tiny_transformer("llama", tok, 3)
    cfg = replace(ir.GPU_CONFIG, layers=(1, 2), scales=(2.0, 5.0), n_loc_sets=1, n_str_pairs=1, n_det=2,
                  n_random=1, concepts=("sea",), dtype="float32")
    out = ir.run_protocol(m, cfg)
    assert out["concept_loc"].shape == (1, 2, 2, 10, 10)
    assert out["random_str"].shape == (1, 2, 2, 2, 2)
    assert out["concept_det"].shape == (1, 2, 2, 2, 2, 2)
    assert out["base_loc"].shape == (10, 10) and out["unit"] == "raw"
    assert np.array_equal(out["loc_target"], np.arange(10))
    # the same entry by a direct hooked injection: concept sea, layer 2, coefficient 5, trial 3
    from companion.experiments._common import concept_units
    tr = ir._trials(m, cfg)
    from companion.transformers.models import encode
    enc = encode(m, tr["texts"])
    mask = ir._spans_mask(m, tr["texts"], tr["spans"], enc)
    v = concept_units(m, ("sea",), None)[0][0][2]
    h = stream.inject(m, enc, 2, v, scale=5.0, positions=torch.as_tensor(mask))
    last = enc["attention_mask"].sum(1) - 1
    lp = torch.log_softmax(readout.logits_from_residual(m, h[-1][torch.arange(len(last)), last]).double(), -1)
    want = lp[:, tr["answer_ids"]].numpy()
    np.testing.assert_allclose(out["concept_loc"][0, 1, 1], want[:10, :10], atol=1e-4)
    np.testing.assert_allclose(out["concept_det"][0, 1, 1].reshape(-1, 2), want[10:, 10:], atol=1e-4)
    # no injection at all: the baseline answers; a tokenizer without a template is refused
    base = torch.log_softmax(readout.logits_from_residual(
        m, stream.residual_stream(m, enc)[-1][torch.arange(len(last)), last]).double(), -1)
    np.testing.assert_allclose(out["base_loc"], base[:10, tr["answer_ids"][:10]].numpy(), atol=1e-4)
    tok2 = copy.deepcopy(tok)
    tok2.chat_template = None
    with pytest.raises(ValueError, match="chat template"):
        ir.run_protocol(tiny_transformer("llama", tok2, 3), cfg)
    with pytest.raises(TypeError):
        ir.run_protocol(m, object())


def test_stored_smollm2_result_is_current_and_balanced():
    import companion.experiments as xp

    cfg = ir.CONFIGS["smollm2-135m"]
    path = xp.result_path(cfg, xp.stored_root())
    assert path.exists(), "the stored injection_report Result is missing"
    r = xp.load_result(path)
    assert r.config_hash == xp.config_hash(cfg) and r.scalars["model_name"] == "smollm2-135m"
    a = r.arrays
    n_lay, S = len(cfg.layers), len(cfg.scales)
    assert a["concept_loc"].shape == (len(cfg.concepts), n_lay, S, cfg.k * cfg.n_loc_sets, cfg.k)
    assert a["random_det"].shape == (cfg.n_random, n_lay, S, cfg.n_det, 2, 2)
    # log-probabilities of distinct options: finite, and the options' mass is at most 1
    for g in ("concept", "random"):
        for t in ("loc", "str", "det"):
            x = a[f"{g}_{t}"]
            assert np.isfinite(x).all() and (np.exp(x).sum(-1) <= 1 + 1e-9).all()
    # without injection the balanced design scores exactly the chance level
    assert ir.accuracy_trials(a["base_loc"], a["loc_target"]).mean() == 1 / cfg.k
    assert ir.accuracy_trials(a["base_str"], a["str_target"]).mean() == 0.5
