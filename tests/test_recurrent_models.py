"""The models this issue's recurrent rewrites and harness fixes make exportable, run as a user would: `exportsmith
generate`, then `exportsmith verify --json` (each model in its own process): Mamba (`sequence-scan`'s prefill, its
decode one token at a time as generate() calls it, no attention mask on its steps) and Inkling2's text model
(`flip-unfolded`'s short convolution). Each must export in every dims style, match eager at batch 1, at one new
token and on a one-token cache, load in a fresh process, and drive greedy loops that give generate()'s tokens."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

MODELS = {"mamba": "mamba", "inkling2": "inkling2_text"}


def _exportsmith(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    command = [str(Path(sys.executable).parent / "exportsmith"), *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=1500)


def test_mamba_and_inkling2_verify_as_users_run_them(tmp_path: Path):
    out = tmp_path / "generated"
    generated = _exportsmith("generate", *MODELS, "--out", str(out), cwd=tmp_path)
    assert generated.returncode == 0, generated.stderr
    records = tmp_path / "records.jsonl"
    verified = _exportsmith("verify", *MODELS.values(), "--out", str(out), "--json", str(records), cwd=tmp_path)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    results = {json.loads(line)["model_type"]: json.loads(line) for line in records.read_text().splitlines()}
    assert set(results) == set(MODELS.values())
    for model_type, result in results.items():
        assert result["status"] == "ok", result
        cases = result["details"]["cases"]
        for dims in ("named", "dynamic", "auto"):
            ran = [case for case in cases if case["dims"] == dims and case["error"] is None]
            assert {"decode", "prefill"} <= {case["program"] for case in ran}, (model_type, dims)
            decode = [case for case in ran if case["program"] == "decode"]
            assert any(case["batch"] == 1 and case["new_tokens"] == 1 and case["past"] == 1 for case in decode)
        assert all(case["max_diff"] <= case["tolerance"] for case in cases)
        assert len(result["details"]["greedy"]) == 6, model_type  # prompts of 1, 2, 12 tokens at batch 1 and 2
    mamba = results["mamba"]["details"]
    assert {case["new_tokens"] for case in mamba["cases"] if case["program"] == "decode"} == {1}
    assert any(entry.startswith("decode: steps of several new tokens") for entry in mamba["outside_range"])
    inkling = results["inkling2_text"]["details"]
    assert len({case["new_tokens"] for case in inkling["cases"] if case["program"] == "decode"}) > 1
