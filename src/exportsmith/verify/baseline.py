"""What exporting the ORIGINAL model does, with no help: the error an upstream patch removes, quoted from a real run.

It runs in a fresh process (`python -m exportsmith.verify.baseline MODEL_TYPE`), because a process that imported
`generated` has registered the cache pytree nodes and would hide the very error being recorded.
"""

from __future__ import annotations

import json
import subprocess
import sys


def original_export_error(model_type: str, timeout: float = 600) -> str | None:
    """Why the original fails verification with plain torch.export (the first error), or None if it verifies."""
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
    from .check import verify_model

    result = verify_model(model_type, subject="original")
    print(json.dumps({"error": None if result.ok else result.message}))


if __name__ == "__main__":
    main(sys.argv[1])
