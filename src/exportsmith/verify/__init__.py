"""Verification of generated models: tiny configs, seeded inputs, export with dynamic shapes, numerics checks."""

from exportsmith.verify.check import VerifyResult, verify_model
from exportsmith.verify.tiny import tiny_config

__all__ = ["VerifyResult", "tiny_config", "verify_model"]
