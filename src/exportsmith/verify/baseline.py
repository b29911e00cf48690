"""What exporting the ORIGINAL model does, with no help: the error an upstream patch removes, quoted from a real run.

It runs in a fresh process (`python -m exportsmith.verify.baseline MODEL_TYPE`), because a process that imported
`generated` has registered the cache pytree nodes and would hide the very error being recorded.
"""

from __future__ import annotations

import json
import subprocess
import sys


def original_export_error(model_type: str, timeout: float = 600) -> str | None:
    """The first line of the error of exporting the original decoder (decode program), or None if it exports."""
    result = subprocess.run(
        [sys.executable, "-m", "exportsmith.verify.baseline", model_type],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if result.returncode != 0:
        lines = result.stderr.strip().splitlines()
        return f"baseline run crashed: {lines[-1] if lines else result.returncode}"
    return json.loads(result.stdout.strip().splitlines()[-1])["error"]


def main(model_type: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from .check import export_program, first_line
    from .inputs import DECODE_EXAMPLE, case_inputs
    from .tiny import tiny_config

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config(model_type)).eval()
    try:
        export_program(model, case_inputs(model, model.config.vocab_size, DECODE_EXAMPLE))
        error = None
    except Exception as exc:  # the error is the result
        error = first_line(exc)
    print(json.dumps({"error": error}))


if __name__ == "__main__":
    main(sys.argv[1])
