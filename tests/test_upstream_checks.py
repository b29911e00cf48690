"""tools/upstream_checks.py measures the upstream series (the transformers checks it runs need a checkout: a tools run)."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("upstream_checks", ROOT / "tools" / "upstream_checks.py")
upstream_checks = importlib.util.module_from_spec(spec)
spec.loader.exec_module(upstream_checks)

# A hunk against transformers' llama: one line re-indented (moved), one second copy of a line the file has, one new
# line, a comment and a blank line
PATCH = """diff --git a/src/transformers/models/llama/modeling_llama.py b/src/transformers/models/llama/modeling_llama.py
--- a/src/transformers/models/llama/modeling_llama.py
+++ b/src/transformers/models/llama/modeling_llama.py
@@ -119,5 +119,9 @@
 def rotate_half(x):
-    return torch.cat((-x2, x1), dim=-1)
+    if torch.compiler.is_exporting():
+        # a comment
+        return torch.cat((-x2, x1), dim=-1)
+
+    return torch.cat((-x2, x1), dim=-1)
"""


# A PR's test: a file the series creates, outside the package
TEST_FILE = """diff --git a/tests/exporters/test_x.py b/tests/exporters/test_x.py
new file mode 100644
--- /dev/null
+++ b/tests/exporters/test_x.py
@@ -0,0 +1,2 @@
+import torch
+    return torch.cat((-x2, x1), dim=-1)
"""


def test_series_lines_tell_moved_new_and_duplicated_code(tmp_path):
    (tmp_path / "0000-llama.patch").write_text(PATCH)
    (tmp_path / "series").write_text("0000-llama.patch\n")
    counts = {"added": 5, "removed": 1, "test lines": 0, "new code": 2, "duplicated": 1}
    assert upstream_checks.series_lines(tmp_path) == counts


def test_a_created_test_file_counts_as_test_lines_not_as_new_code(tmp_path):
    (tmp_path / "0000-llama.patch").write_text(PATCH + TEST_FILE)
    (tmp_path / "series").write_text("0000-llama.patch\n")
    counts = {"added": 7, "removed": 1, "test lines": 2, "new code": 2, "duplicated": 1}
    assert upstream_checks.series_lines(tmp_path) == counts


def test_edited_models_are_read_from_the_patch_paths(tmp_path):
    (tmp_path / "0000-llama.patch").write_text(PATCH)
    (tmp_path / "series").write_text("0000-llama.patch\n")
    assert upstream_checks.edited_models(tmp_path) == ["llama"]


def test_a_mismatch_the_released_tree_has_already_is_added_only_when_the_series_changes_it():
    ok = {"status": "ok", "files": [], "diffs": {}}
    old = {"status": "mismatch", "files": ["processing_x.py"], "diffs": {"processing_x.py": ["-a", "+b"]}}
    assert not upstream_checks.added_mismatch(ok, ok)
    assert upstream_checks.added_mismatch(ok, old)  # passed released, fails patched
    assert not upstream_checks.added_mismatch(old, dict(old))  # the same difference on both trees
    worse = {
        "status": "mismatch",
        "files": ["modeling_x.py", "processing_x.py"],
        "diffs": {**old["diffs"], "modeling_x.py": ["+c"]},
    }
    assert upstream_checks.added_mismatch(old, worse)
    assert not upstream_checks.added_mismatch(old, ok)  # fixed by the series
