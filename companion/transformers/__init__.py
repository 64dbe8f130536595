"""Real pretrained Transformers: load them (``models``, weights from ``sources``), hook them
(``hooks``), read and write their residual stream (``stream``), and read logits, loss and
embeddings from it (``readout``).  No weight folding, no re-centring: the modules run as trained.
"""
