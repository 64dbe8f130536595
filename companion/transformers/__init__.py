"""Real pretrained Transformers: load them (``models``, weights from ``sources``), hook them (``hooks``),
read and write their residual stream (``stream``) and read logits, loss and embeddings (``readout``)."""
