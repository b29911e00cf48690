"""Qwen-style vision towers with the codemods of issue 19 (segment-attention, vision-grid-loops, exclusive-cumsum):
the generated Qwen2-VL, Qwen2.5-VL (windowed attention) and Qwen3-VL towers, and PaddleOCR-VL's (its attention loops
over the images keeping each one's weights; its embeddings interpolate positions by the grid), tiny and seeded,
export in every dims style and match transformers' towers on 1, 2 and 3 images of different sizes (`tasks.patch_inputs(varied=True)`: 8x8, 10x6 and 6x10 patches), from
one program each, with the pixel values and the grid as the only inputs. Run as a user would: `exportsmith
generate`, then `exportsmith verify --json` (each tower in its own process)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

TOWERS = {
    "qwen2_vl": "qwen2_vl_vision",
    "qwen2_5_vl": "qwen2_5_vl_vision",
    "qwen3_vl": "qwen3_vl_vision",
    "paddleocr_vl": "paddleocr_vl_vision",
}


def _exportsmith(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    command = [str(Path(sys.executable).parent / "exportsmith"), *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=1200)


def test_qwen_vision_towers_take_any_number_of_images_of_any_sizes(tmp_path: Path):
    out = tmp_path / "generated"
    generated = _exportsmith("generate", *TOWERS, "--out", str(out), cwd=tmp_path)
    assert generated.returncode == 0, generated.stderr
    records = tmp_path / "records.jsonl"
    verified = _exportsmith("verify", *TOWERS.values(), "--out", str(out), "--json", str(records), cwd=tmp_path)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    results = [json.loads(line) for line in records.read_text().splitlines()]
    assert sorted(result["model_type"] for result in results) == sorted(TOWERS.values())
    for result in results:
        assert result["status"] == "ok", result
        cases = result["details"]["cases"]
        for dims in ("named", "dynamic", "auto"):
            batches = {case["batch"] for case in cases if case["dims"] == dims and case["error"] is None}
            assert batches == {1, 2, 3}, (result["model_type"], dims)
        assert all(case["max_diff"] <= case["tolerance"] for case in cases)


def test_a_tower_on_its_own_gets_images_of_different_sizes():
    from exportsmith.verify import tasks, tiny
    from exportsmith.verify.check import FORWARD_SHAPES

    _, model_class = tasks.model_class("qwen2_vl_vision")
    config = tiny.tiny_config("qwen2_vl_vision")
    model = tiny.build_tiny_model(model_class, tasks.config_for(model_class, config))
    grids = [tasks.dummy_inputs(model, shape=shape)["grid_thw"] for shape in FORWARD_SHAPES]
    assert sorted(len(grid) for grid in grids) == [1, 2, 3]
    three = max(grids, key=len)
    assert len({tuple(row) for row in three.tolist()}) == 3  # three sizes
    for shape in FORWARD_SHAPES:  # as many patches as the grid says
        inputs = tasks.dummy_inputs(model, shape=shape)
        assert inputs["hidden_states"].shape[0] == int(inputs["grid_thw"].prod(-1).sum())
