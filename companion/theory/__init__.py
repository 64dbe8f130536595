"""Part I of the book: the mathematics, in numpy and scipy (importing it never loads torch).

* ``subgaussian``: optimal variance proxies of scipy laws, Chernoff bounds, psi_2 norms
* ``empirical``: empirical and Monte Carlo tails (re-exported by ``subgaussian``)
* ``concentration``: sub-exponential laws, Bernstein and Hoeffding, maxima, norms
* ``exceedance``: Theorems 1 and 2: exceedance bounds, exact Gaussian counts, simulations
* ``normalisation``: LayerNorm and RMSNorm maps and their Jacobians (Part II's geometry)
* ``bootstrap``: bootstrap intervals, the one resampling layer of every empirical verdict
* ``_cgf``: the numerical core of the proxies (quadrature of cumulant generating functions)
"""
