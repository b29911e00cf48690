"""A test run's content-hash cache directory (tests/conftest.py: a fresh one per run, so no run reads another's) is
deleted with the run: CI runs the suite in several environments on a small disk."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_a_test_run_leaves_no_cache_directory_behind(tmp_path: Path):
    tests = Path(__file__).parent
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # where tempfile.mkdtemp puts the run's cache
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tests / "test_codemods.py"), "-k"]
    finished = subprocess.run(
        [*command, "flip_unfolded and test_fixture"], cwd=tests.parent, env=env, capture_output=True, text=True
    )
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert "passed" in finished.stdout
    assert not list(tmp_path.glob("exportsmith-test-cache-*"))
