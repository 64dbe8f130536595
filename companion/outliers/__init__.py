"""Part III, outliers: per-channel statistics of real residual streams and what makes them large.

Modules: ``channel_statistics`` (streamed moments and exceedance counts), ``regimes`` (predicted versus
observed counts, tails), ``attention_logits`` (q . k), ``massive_activations``, ``outlier_features``.
"""
