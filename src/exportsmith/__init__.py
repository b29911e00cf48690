"""exportsmith: rewrites the modeling code of the installed transformers so that torch.export can trace it."""

__version__ = "0.1.0"
