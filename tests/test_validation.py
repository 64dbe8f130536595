"""companion._validation: the shared argument checks, and unfrozen scipy distributions.

Every public function that takes a distribution accepts an unfrozen one that needs no shape
parameter (frozen with its defaults, ``dist()``) and gives the same numbers as for ``dist()``;
an unfrozen one that needs shape parameters raises a TypeError that says to freeze it.
"""

import math

import numpy as np
import pytest
from scipy import stats

from companion.theory import concentration as conc
from companion.theory import subgaussian
from companion._validation import (check_dist, check_finite, check_int, check_layer, check_real, check_texts,
                                  check_thresholds, check_vector, freeze, is_int, is_real, real_array)

RV_SAMPLE = stats.rv_discrete(values=([-1, 0, 2], [0.25, 0.5, 0.25]))


@pytest.mark.parametrize("gen", [stats.norm, stats.expon, stats.uniform, RV_SAMPLE])
def test_unfrozen_without_shapes_is_frozen_with_defaults(gen):
    frozen = freeze(gen)
    assert frozen.dist.name == gen.name and frozen.args == () and frozen.kwds == {}
    assert check_dist(gen).mean() == gen().mean()


def test_frozen_and_other_values_pass_through_freeze():
    d = stats.norm(1.0, 2.0)
    assert freeze(d) is d
    assert freeze(3.0) == 3.0


@pytest.mark.parametrize("gen, shapes", [(stats.bernoulli, "p"), (stats.gamma, "a"), (stats.beta, "a, b")])
def test_unfrozen_with_shapes_raises_type_error_saying_to_freeze(gen, shapes):
    with pytest.raises(TypeError, match=r"frozen scipy.stats distribution.*needs its shape") as info:
        check_dist(gen, "dist")
    msg = str(info.value)
    assert f"scipy.stats.{gen.name}" in msg and shapes in msg and "freeze it with its parameters" in msg


@pytest.mark.parametrize("func", [
    subgaussian.optimal_variance_proxy,
    subgaussian.psi2_norm,
    lambda d: subgaussian.log_mgf(d, [0.5, 1.0]),
    lambda d: subgaussian.proxy_profile(d, [0.5, 1.0]),
    lambda d: conc.subexponential_nu2(d, 2.0),
    lambda d: conc.psi1_norm(d),
])
@pytest.mark.parametrize("gen", [stats.norm, stats.expon, RV_SAMPLE])
def test_public_functions_accept_unfrozen_without_shapes(func, gen):
    a, b = func(gen), func(gen())
    np.testing.assert_array_equal(np.asarray(a, dtype=float), np.asarray(b, dtype=float))


@pytest.mark.parametrize("func", [
    subgaussian.optimal_variance_proxy, subgaussian.psi2_norm, conc.psi1_norm,
    lambda d: conc.subexponential_nu2(d, 2.0),
    lambda d: subgaussian.monte_carlo_tail(d, 1.0, 10, np.random.default_rng(0)),
])
def test_public_functions_reject_unfrozen_with_shapes(func):
    with pytest.raises(TypeError, match="freeze it with its parameters"):
        func(stats.bernoulli)


def test_monte_carlo_tail_accepts_unfrozen_norm():
    p = subgaussian.monte_carlo_tail(stats.norm, [1.0], 20_000, np.random.default_rng(0))
    q = subgaussian.monte_carlo_tail(stats.norm(), [1.0], 20_000, np.random.default_rng(0))
    assert p[0] == q[0]


def test_scalar_checks():
    assert is_int(np.int64(3)) and not is_int(True) and not is_int(3.0)
    assert is_real(2) and is_real(np.float32(1.5)) and not is_real(False)
    assert check_int(np.int32(4), "n", 1) == 4 and type(check_int(np.int32(4), "n")) is int
    with pytest.raises(TypeError, match="n must be an integer, got bool"):
        check_int(True, "n")
    with pytest.raises(ValueError, match="n must be >= 1, got 0"):
        check_int(0, "n", 1)
    assert check_real(1, "x") == 1.0
    with pytest.raises(ValueError, match="x must be finite"):
        check_real(math.inf, "x")
    with pytest.raises(ValueError, match="x must be > 0, got 0.0"):
        check_real(0, "x", lo=0, lo_open=True)
    with pytest.raises(ValueError, match="x must be <= 1, got 2.0"):
        check_real(2, "x", hi=1)


def test_array_checks():
    import torch

    np.testing.assert_array_equal(real_array("x", [[1, 2], [3, 4]]), [[1.0, 2.0], [3.0, 4.0]])
    t = torch.tensor([0.1, 0.2], dtype=torch.bfloat16)
    assert real_array("x", t).dtype == np.float64 and real_array("x", t).tolist() == t.double().tolist()
    assert real_array("x", 3).shape == ()
    for bad, err, match in [("ab", TypeError, "string"), ([True], TypeError, "bool"),
                            (torch.tensor([True]), TypeError, "bool"), ([[1], [2, 3]], ValueError, "rectangular"),
                            ([1.0, np.nan, np.inf], ValueError, "2 NaN or infinite value")]:
        with pytest.raises(err, match=match):
            real_array("x", bad)
    with pytest.raises(ValueError, match="at least 1 dimension"):
        real_array("x", 2.0, min_ndim=1)
    check_finite(np.ones(3), "x")
    with pytest.raises(ValueError, match="x contains 1 NaN"):
        check_finite(np.array([1.0, np.nan]), "x")
    assert check_layer(np.int64(3), 4) == 3
    with pytest.raises(ValueError, match=r"\[0, 4\] for m"):
        check_layer(5, 4, "m")
    with pytest.raises(TypeError, match="every layer must be an integer"):
        check_layer(True, 4, name="every layer")


def test_check_vector():
    import torch

    out = check_vector(np.arange(3), 3, dtype=torch.float32)
    assert out.dtype == torch.float32 and out.tolist() == [0.0, 1.0, 2.0]
    assert check_vector(torch.ones(2, 3), 3, 2, dtype=torch.float64).shape == (2, 3)
    assert check_vector(np.arange(3.0)[::-1], 3, dtype=torch.float64).tolist() == [2.0, 1.0, 0.0]
    with pytest.raises(ValueError, match=r"shape \(3,\) for m, got \(2, 3\)"):
        check_vector(torch.ones(2, 3), 3, dtype=torch.float32, where="m")
    with pytest.raises(TypeError, match="real numbers"):
        check_vector(torch.ones(3, dtype=torch.bool), 3, dtype=torch.float32)
    with pytest.raises(ValueError, match="NaN"):
        check_vector([1.0, np.nan, 0.0], 3, dtype=torch.float32)
    with pytest.raises(ValueError, match="torch.float16"):
        check_vector([1e5, 0.0, 0.0], 3, dtype=torch.float16)
    with pytest.raises(ValueError, match="scale \\* v reaches"):
        check_vector([1.0, 0.0, 0.0], 3, dtype=torch.float32, scales=(2.0, 1e39), name="v")


def test_check_texts_and_thresholds():
    assert check_texts(("a", "b c")) == ["a", "b c"] and check_texts("a", single=True) == ["a"]
    for bad, err, match in [("a", TypeError, "list of strings, got str"), ([], ValueError, "empty"),
                            (["a", 3], TypeError, r"texts\[1\] must be a string"),
                            (["a", " "], ValueError, r"texts\[1\] is empty"), (b"ab", TypeError, "list")]:
        with pytest.raises(err, match=match):
            check_texts(bad)
    np.testing.assert_array_equal(check_thresholds(2), [2.0])
    np.testing.assert_array_equal(check_thresholds([0, 1.5]), [0.0, 1.5])
    for bad, err, match in [([-1.0], ValueError, ">= 0"), ([], ValueError, "non-empty"),
                            ([[1.0]], ValueError, "1-D"), (["a"], TypeError, "thresholds"),
                            ([np.inf], ValueError, "infinite")]:
        with pytest.raises(err, match=match):
            check_thresholds(bad)


def test_shared_checks_of_the_torch_layers():
    import torch

    from companion._validation import (check_choice, check_indices, check_linears, float_tensor,
                                       real_vector)

    assert real_array("w", [[1, 2]], shape=(None, 2)).shape == (1, 2)
    with pytest.raises(ValueError, match=r"w must have shape \(n, 3\), got \(1, 2\)"):
        real_array("w", [[1, 2]], shape=(None, 3))
    np.testing.assert_array_equal(real_vector("v", torch.tensor([1.0, 2.0]), size=2), [1.0, 2.0])
    for bad, match in [([], "non-empty 1-D"), ([[1.0]], "shape"), ([1.0, np.nan], "1 NaN")]:
        with pytest.raises(ValueError, match=match):
            real_vector("v", bad)
    t, was_numpy = float_tensor(np.ones((2, 3)))
    assert isinstance(t, torch.Tensor) and was_numpy
    for bad, err, match in [([1.0], TypeError, "torch.Tensor or numpy"), (np.ones(2, dtype=int), TypeError, "floating"),
                            (np.array(1.0), ValueError, "at least one axis"), (np.ones((0, 2)), ValueError, "empty"),
                            (torch.tensor([1.0, float("inf")], dtype=torch.bfloat16), ValueError, "1 NaN")]:
        with pytest.raises(err, match=match):
            float_tensor(bad)
    assert check_choice("a", "kind", ("a", "b")) == "a"
    with pytest.raises(ValueError, match=r"kind must be one of \('a', 'b'\), got 'c'"):
        check_choice("c", "kind", ("a", "b"))
    with pytest.raises(TypeError, match="kind must be a string"):
        check_choice(1, "kind", ("a", "b"))
    assert check_indices(torch.tensor([2, 0]), 3).tolist() == [2, 0]
    for bad, err, match in [([3], ValueError, "lie in"), ([0, 0], ValueError, "repeated"),
                            ([0.5], TypeError, "integers"), ([[0]], ValueError, "1-D")]:
        with pytest.raises(err, match=match):
            check_indices(bad, 3)
    lin = torch.nn.Linear(2, 2)
    assert check_linears({"l": lin}, lin) == {"l": lin}
    for args, err, match in [(({"l": lin}, None), TypeError, "model must be"), (([lin],), TypeError, "mapping"),
                             (({},), ValueError, "empty"), (({"r": torch.nn.ReLU()},), TypeError, "not torch.nn.Linear")]:
        with pytest.raises(err, match=match):
            check_linears(*args)


def test_check_layer_list():
    from companion._validation import check_layer_list

    assert check_layer_list([0, 3, 5]) == (0, 3, 5)
    assert check_layer_list(()) == ()
    for bad in ([1, 1], [-1, 2], [0, 2.5]):
        with pytest.raises(ValueError, match="distinct non-negative integers"):
            check_layer_list(bad)
    with pytest.raises(ValueError, match="increasing"):
        check_layer_list([3, 1])
