"""Part I of the book: the mathematics, in numpy and scipy (importing it never loads torch).

Sub-Gaussian tails and proxies (``subgaussian``, ``empirical``), ``concentration``, exceedance counts
(``exceedance``: Theorems 1 and 2), LayerNorm/RMSNorm maps (``normalisation``), random weight matrices
and bilinear forms (``random_matrices``), the ``bootstrap``;
``_cgf`` is the numerical core of the proxies.
"""
