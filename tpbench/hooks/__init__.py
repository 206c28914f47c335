"""Reference implementations of PyTorch's documented DDP communication hooks.

This package imports nothing else of tpbench: copy ``from tpbench.hooks import ...`` into any
training script.
"""
