"""Part II's laboratory: residual stacks and the tiny language model, in plain PyTorch.

========================  ==================================================================
``residual``              StackConfig, ResidualStack (Pre-LN / Post-LN / scaled residuals), signal propagation
``tinylm``                TinyLM, its byte tokenizer and training loop, the injection engine's StackAdapter
========================  ==================================================================

The old flat path ``companion.stacks.<name>`` still works for one release, with a
``DeprecationWarning`` naming the new module (``companion._aliases``).
"""

from companion._aliases import package_getattr as _package_getattr

__getattr__ = _package_getattr(__name__)
