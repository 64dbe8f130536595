"""The bootstrap intervals of companion.theory.bootstrap (moved from massive_activations and attribution)."""

import numpy as np
import pytest

from companion.theory import bootstrap as rs


def test_bootstrap_interval():
    x = np.random.default_rng(0).normal(3.0, 1.0, 400)
    mean, lo, hi = rs.bootstrap_interval(x)
    assert lo < mean < hi and mean == pytest.approx(x.mean())
    assert hi - lo == pytest.approx(2 * 1.96 / 20, rel=0.15)     # about 2 x 1.96 sd / sqrt(n)
    m2, lo2, hi2 = rs.bootstrap_interval(np.c_[x, 2 * x])
    np.testing.assert_allclose(m2, [x.mean(), 2 * x.mean()])
    assert rs.bootstrap_interval(x, rng=1) != rs.bootstrap_interval(x, rng=2)
    assert rs.bootstrap_interval(x) == rs.bootstrap_interval(x)    # seed 0 by default
    for bad, exc in (([1.0], ValueError), ([[[1.0]]], ValueError), ([1.0, np.nan], ValueError),
                     (["a", "b"], TypeError)):
        with pytest.raises(exc):
            rs.bootstrap_interval(bad)
    with pytest.raises(ValueError):
        rs.bootstrap_interval(x, level=1.0)
    with pytest.raises(ValueError):
        rs.bootstrap_interval(x, n_boot=1)
    with pytest.raises(TypeError):
        rs.bootstrap_interval(x, rng="seed")


def test_bootstrap_ratio():
    est, lo, hi = rs.bootstrap_ratio(np.ones((3, 4)))
    assert (est, lo, hi) == (1.0, 1.0, 1.0)
    g = np.random.default_rng(0)
    num = g.normal(2.0, 1.0, size=(20, 30))
    est, lo, hi = rs.bootstrap_ratio(num, np.ones_like(num), n_boot=500, seed=3)
    assert lo < est < hi and abs(est - num.mean()) < 1e-12
    assert rs.bootstrap_ratio(num, n_boot=500, seed=3) == (est, lo, hi)
    with pytest.raises(ValueError, match="one shape"):
        rs.bootstrap_ratio(np.ones((2, 3)), np.ones((3, 2)))
    with pytest.raises(ValueError, match="level"):
        rs.bootstrap_ratio(np.ones((2, 3)), level=1.0)
    with pytest.raises(ValueError):
        rs.bootstrap_ratio(np.ones(3))
    with pytest.raises(ValueError):
        rs.bootstrap_ratio(np.ones((2, 2)), n_boot=0)
