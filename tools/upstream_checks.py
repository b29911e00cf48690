"""The upstream patch series measured: its size, its second copies of code, and transformers' own repository checks.

    python tools/upstream_checks.py [--repo TRANSFORMERS_CHECKOUT] [--series DIR] [--work build/upstream-checks]

Measures the series of `exportsmith diff --all --out DIR` (made in WORK/series when `--series` is not given): its
lines added and removed, and how many added lines are second copies of code the file already has (`series_lines`).
With `--repo`, also runs transformers' own checks on it, as a differential (released tree vs patched tree). A
maintainer runs `utils/check_modular_conversion.py` (every generated modeling file is what the modular converter
makes of its `modular_*.py`) and `utils/check_copies.py` (every `# Copied from` block equals its source) on a PR. This
tool runs the same scripts, taken from a transformers checkout (`--repo`: its `utils/` and `pyproject.toml`; the
project never vendors them), on two trees whose `src/transformers` is the installed release: as released, and with
the series of `exportsmith diff --all --out DIR` applied in order. What fails on the patched tree and not on the
released one is what the series breaks; failures on both come from the scripts' version, not from the series.

The modular check covers the modular files of the models the series edits and of the models that inherit from them
(the converter copies a parent's code into its children), each converted in turn as the script does, without
writing. Needs `git` (to apply the series) and `ruff` beside this Python (the scripts format with it). Writes
WORK/report.md and prints it; exits 1 when the series adds a failure.
"""

from __future__ import annotations

import argparse
import json
import keyword
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Run inside a tree (cwd), with the checkout's utils on sys.path: one JSON line per modular file in scope
_MODULAR_CHILD = r"""
import difflib, glob, json, sys
sys.path.insert(0, "utils")
import check_modular_conversion as checker
from create_dependency_mapping import find_priority_list

changed = set(sys.argv[1].split(","))
files = sorted(glob.glob("src/transformers/models/**/modular_*.py", recursive=True))
ordered, dependencies = find_priority_list(files)
if ordered and isinstance(ordered[0], list):
    ordered = [path for level in ordered for path in level]

def model(dotted_or_path):
    return dotted_or_path.replace("/", ".").split(".")[-2]

for path in ordered:
    if model(path) not in changed and not any(model(dep) in changed for dep in dependencies.get(path, ())):
        continue
    try:
        generated = checker.convert_and_run_ruff(path)
        differ, diffs = [], {}
        for file_type, content in generated.items():
            prefix, _, suffix = file_type.partition(".*")
            target = path.replace("modular_", f"{prefix}_").replace(".py", f"{suffix}.py")
            content = content[0] if isinstance(content, tuple) else content
            with open(target, encoding="utf-8") as handle:
                written = handle.read().splitlines()
            if content.splitlines() != written:
                differ.append(target.rsplit("/", 1)[-1])
                # what the mismatch is, without line numbers: the same on both trees when the series left it alone
                lines = difflib.unified_diff(written, content.splitlines(), lineterm="", n=0)
                diffs[target.rsplit("/", 1)[-1]] = [line for line in lines if line[:1] in "+-" and line[:3] not in ("+++", "---")]
        status = "mismatch" if differ else "ok"
        print(json.dumps({"file": path, "status": status, "files": differ, "diffs": diffs}), flush=True)
    except Exception as error:
        print(json.dumps({"file": path, "status": "error", "files": [" ".join(str(error).split())[:200]]}), flush=True)
"""


def build_tree(tree: Path, repo: Path) -> None:
    """`tree/src/transformers`: the installed release; `tree/utils`, `tree/pyproject.toml`: the checkout's."""
    import transformers

    if tree.exists():
        shutil.rmtree(tree)
    shutil.copytree(
        Path(transformers.__file__).parent, tree / "src" / "transformers", ignore=shutil.ignore_patterns("__pycache__")
    )
    (tree / "utils").symlink_to((repo / "utils").resolve())
    shutil.copy(repo / "pyproject.toml", tree / "pyproject.toml")


def apply_series(tree: Path, series: Path) -> None:
    for name in (series / "series").read_text().split():
        subprocess.run(["git", "apply", "--whitespace=nowarn", str((series / name).resolve())], cwd=tree, check=True)


def edited_models(series: Path) -> list[str]:
    models = set()
    for name in (series / "series").read_text().split():
        for line in (series / name).read_text().splitlines():
            if line.startswith("+++ b/src/transformers/models/"):
                models.add(line.split("/")[4])
    return sorted(models)


def series_lines(series: Path) -> dict[str, int]:
    """The series' size in lines: `added` and `removed` (as `git diff --stat` counts them), `test lines` (the added
    lines of the files under tests/: the PRs' tests), and of the package's lines: `new code` (added code
    lines that are not a line moved or re-indented: the hunk does not remove the same text) and `duplicated` (new
    code lines whose text is already in the file: second copies of existing code, such as an export twin of a loop).
    Code lines are those `_is_code` admits; texts are compared stripped."""
    counts = Counter()
    for name in (series / "series").read_text().split():
        for file_diff in (series / name).read_text().split("\ndiff --git "):
            path = next((line[6:] for line in file_diff.splitlines() if line.startswith("+++ b/")), None)
            if path is None:
                continue
            is_test = path.startswith("tests/")  # a PR's test: its own count, and no code of the file to copy
            original = set()
            if path.startswith("src/transformers/"):
                source = _installed_root() / path.removeprefix("src/transformers/")
                original = {line.strip() for line in source.read_text(encoding="utf-8").splitlines()}
            for hunk in file_diff.split("\n@@")[1:]:
                plus, minus = Counter(), Counter()
                for line in hunk.splitlines()[1:]:
                    sign, text = line[:1], line[1:].strip()
                    counts["added"] += sign == "+"
                    counts["test lines"] += sign == "+" and is_test
                    counts["removed"] += sign == "-"
                    if _is_code(text) and sign in ("+", "-") and not is_test:
                        (plus if sign == "+" else minus)[text] += 1
                for text, count in plus.items():
                    new = max(0, count - minus[text])
                    counts["new code"] += new
                    counts["duplicated"] += new if text in original else 0
    return {key: counts[key] for key in ("added", "removed", "test lines", "new code", "duplicated")}


def _is_code(text: str) -> bool:
    """A line that says something: a name or a literal beyond Python keywords and punctuation (`)`, `else:` and
    `return None` are in every function and copy nothing), and not a comment."""
    if text.startswith("#"):
        return False
    return any(not keyword.iskeyword(word) for word in re.findall(r"\w+", text))


def _installed_root() -> Path:
    import transformers

    return Path(transformers.__file__).parent


def _environment() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH="src", PYTHONDONTWRITEBYTECODE="1")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # the scripts call `ruff`
    return env


def modular_check(tree: Path, models: list[str]) -> dict[str, dict]:
    result = subprocess.run(
        [sys.executable, "-c", _MODULAR_CHILD, ",".join(models)],
        cwd=tree,
        env=_environment(),
        capture_output=True,
        text=True,
    )
    records = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode != 0 and not records:
        raise SystemExit(f"the modular check did not run in {tree}: {result.stderr.strip().splitlines()[-1:]}")
    return {record["file"]: record for record in records}


def copies_check(tree: Path) -> tuple[int, list[str]]:
    result = subprocess.run(
        [sys.executable, "utils/check_copies.py"], cwd=tree, env=_environment(), capture_output=True, text=True
    )
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.startswith("- ")]
    return result.returncode, lines


def added_mismatch(base: dict | None, patched: dict) -> bool:
    """Whether the series adds a mismatch to a modular file: it fails on the patched tree, and passed on the released
    one or failed there with another difference (a generated file the series edits otherwise than the converter)."""
    if patched["status"] == "ok":
        return False
    if base is None or base["status"] == "ok" or "diffs" not in base or "diffs" not in patched:
        return base is None or base["status"] == "ok"
    return base["diffs"] != patched["diffs"]


def report(models, base_modular, patched_modular, base_copies, patched_copies, seconds) -> tuple[str, int]:
    added = sorted(path for path, record in patched_modular.items() if added_mismatch(base_modular.get(path), record))
    fixed = sorted(
        path
        for path, record in patched_modular.items()
        if record["status"] == "ok" and base_modular.get(path, {}).get("status") != "ok"
    )
    masked = sorted(path for path, record in base_modular.items() if record["status"] != "ok")
    new_copies = sorted(set(patched_copies[1]) - set(base_copies[1]))
    lines = [
        "## transformers' own checks",
        "",
        f"The series edits {len(models)} model folders; the modular check covered {len(patched_modular)} modular "
        f"files (theirs and their children's) on both trees; {seconds:.0f} s.",
        "",
        "| check | released tree | patched tree | added by the series |",
        "|---|---|---|---|",
        f"| check_modular_conversion | {len(base_modular) - len(masked)} ok, {len(masked)} fail | "
        f"{sum(r['status'] == 'ok' for r in patched_modular.values())} ok | **{len(added)}** |",
        f"| check_copies | exit {base_copies[0]}, {len(base_copies[1])} failures | exit {patched_copies[0]}, "
        f"{len(patched_copies[1])} failures | **{len(new_copies)}** |",
        "",
    ]
    if added:
        lines += ["Modular files the series breaks:", ""]
        lines += [f"- `{path}`: {', '.join(patched_modular[path]['files'])}" for path in added] + [""]
    if new_copies:
        lines += ["Copies the series breaks:", ""] + new_copies + [""]
    if fixed:
        lines += [f"Modular files that fail released and pass patched: {', '.join(fixed)}", ""]
    if masked:
        lines += [
            f"Fail on the released tree already (the scripts' version differs from the release): {len(masked)} files;"
            " for these the series adds a mismatch when the converter's output differs from a generated file otherwise"
            " on the patched tree than on the released one.",
            "",
        ]
    return "\n".join(lines), int(bool(added or new_copies))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, help="a transformers checkout (its utils/ and pyproject.toml)")
    parser.add_argument("--series", type=Path, help="`exportsmith diff --all --out DIR` output (made when absent)")
    parser.add_argument("--work", type=Path, default=ROOT / "build" / "upstream-checks")
    args = parser.parse_args()
    if args.repo and not all((args.repo / name).is_file() for name in ("utils/check_copies.py", "pyproject.toml")):
        print(f"{args.repo} holds no utils/check_copies.py and pyproject.toml: give a transformers checkout")
        return 2
    start = time.time()
    series = args.series or args.work / "series"
    if args.series is None:
        subprocess.run([sys.executable, "-m", "exportsmith", "diff", "--all", "--out", str(series)], check=True)
    size = series_lines(series)
    text = (
        f"# The upstream series\n\n{len((series / 'series').read_text().split())} patches: +{size['added']} "
        f"-{size['removed']} lines ({size['test lines']} of the added in the PRs' tests); {size['new code']} new code "
        f"lines in the package, {size['duplicated']} of them second copies of code the file already has.\n"
    )
    status = 0
    if args.repo:
        models = edited_models(series)
        base, patched = args.work / "released", args.work / "patched"
        build_tree(base, args.repo)
        build_tree(patched, args.repo)
        apply_series(patched, series)
        base_modular, patched_modular = modular_check(base, models), modular_check(patched, models)
        checks, status = report(
            models, base_modular, patched_modular, copies_check(base), copies_check(patched), time.time() - start
        )
        text += "\n" + checks
    args.work.mkdir(parents=True, exist_ok=True)
    (args.work / "report.md").write_text(text + "\n", encoding="utf-8")
    print(text)
    return status


if __name__ == "__main__":
    sys.exit(main())
