"""The `exportsmith` command: a thin typer app over discover / generate / pipeline / verify.

Data goes to stdout (patches, rewritten source, listings), summaries and errors to stderr. Exit codes: 0 success,
1 a check or verification failed, 2 bad input (unknown model, missing transformers, unreadable file).
"""

from __future__ import annotations

import importlib.metadata
import json
import keyword
import os
import sys
from collections import Counter
from pathlib import Path

import typer

from codemods import ALL_CODEMODS

from .content_cache import ContentCache
from .discover import DiscoveryError, Transformers, find_transformers
from .generate import GenerateError, generated_modules, generated_version, render, stale_diff, write_tree
from .pipeline import run_codemods
from .upstream import patch_series, patch_text
from .vendor import VendorError

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__.splitlines()[0])

USER_ERRORS = (DiscoveryError, GenerateError, VendorError, OSError, UnicodeDecodeError)


def _say(message: str) -> None:
    typer.echo(message, err=True)


def _fail(message: str, code: int = 2) -> typer.Exit:
    _say(f"error: {message}")
    return typer.Exit(code)


def _package_dir(out: Path) -> Path:
    """`out`, refused unless its name can be imported as the package it holds (`import generated.llama`) without
    hiding an installed one."""
    name = out.resolve().name
    if not name.isidentifier() or keyword.iskeyword(name):
        raise _fail(f"--out {out}: '{name}' cannot be imported as a Python package; name it like build/my_gen_v1")
    if name in sys.stdlib_module_names or name in importlib.metadata.packages_distributions():
        raise _fail(
            f"--out {out}: a package named '{name}' would hide the installed module {name}; choose another name"
        )
    return out


def _transformers() -> Transformers:
    try:
        return find_transformers()
    except DiscoveryError as error:
        raise _fail(str(error)) from None


def _modules(tf: Transformers, names: list[str]) -> list[str]:
    try:
        return sorted({tf.resolve(name).module for name in names})
    except DiscoveryError as error:
        raise _fail(str(error)) from None


def _with_parts(tf: Transformers, modules: list[str]) -> list[str]:
    """`modules` and the modules their composite models build through the auto classes, saying which were added."""
    added = {part: module for module in modules for part in tf.parts(module) if part not in modules}
    if added:
        listed = ", ".join(f"{part} ({added[part]})" for part in sorted(added))
        _say(f"with the models they are built from: {listed}")
    return sorted({*modules, *added})


@app.command("list")
def list_(
    models: bool = typer.Option(False, "--models", help="List the model modules instead of the codemods."),
    real_configs: bool = typer.Option(
        False, "--real-configs", help="List the real checkpoint configurations `verify --config` takes by name."
    ),
):
    """List the codemods (pipeline order) with their descriptions, the models of the installed transformers, or the
    real configurations the project holds."""
    if real_configs:
        from .verify.real import real_config_names

        for name in real_config_names():
            typer.echo(name)
        return
    if models:
        tf = _transformers()
        for module, files in tf.models.items():
            typer.echo(f"{module}\t{' '.join(files.model_types)}")
        return
    for codemod in ALL_CODEMODS:
        typer.echo(f"{codemod.NAME}\t{codemod.DESCRIPTION}")


JOBS = typer.Option(os.cpu_count() or 1, "--jobs", "-j", help="Processes to render models in.")
NO_CACHE = typer.Option(False, "--no-cache", help="Render everything, ignoring the content-hash cache.")


def _render(tf: Transformers, modules: list[str], jobs: int, no_cache: bool):
    progress = _say if len(modules) > 1 else None
    try:
        return render(tf, modules, progress=progress, jobs=jobs, cache=None if no_cache else ContentCache())
    except USER_ERRORS as error:
        raise _fail(str(error)) from None


@app.command()
def generate(
    models: list[str] = typer.Argument(None, help="Model types or module names (llama, gpt2, qwen2_moe, ...)."),
    all_models: bool = typer.Option(False, "--all", help="Every model of the installed transformers."),
    out: Path = typer.Option(Path("generated"), "--out", help="The generated package directory."),
    jobs: int = JOBS,
    no_cache: bool = NO_CACHE,
):
    """Write the vendored, export-ready copies of MODELS (plus those already in OUT) to OUT, atomically. Without
    MODELS, regenerate the models OUT holds (e.g. for another installed transformers)."""
    tf = _transformers()
    _package_dir(out)
    held = generated_modules(out)
    if all_models and models or not (all_models or models or held):
        raise _fail("name the models to generate, or pass --all")
    wanted = list(tf.models) if all_models else _with_parts(tf, _modules(tf, models or []))
    modules = sorted(set(wanted) | set(held))
    rendered = _render(tf, modules, jobs, no_cache)
    changed = sum(change.changed for change in rendered.changes)
    summary = (
        f"{len(modules)} model(s) from transformers {tf.version} ({changed} of their modules changed by codemods)"
    )
    if not stale_diff(rendered.files, out, names_only=True):
        _say(f"{out} already up to date: {summary}")
    else:
        try:
            write_tree(rendered.files, out)
        except OSError as error:
            raise _fail(f"cannot write {out}: {error}") from None
        _say(f"generated {summary} into {out}")
    refused = Counter(f.codemod for change in rendered.changes for f in change.findings if f.kind == "refused")
    if refused:
        counts = ", ".join(f"{codemod} {count}" for codemod, count in sorted(refused.items()))
        _say(f"left as they were, with a reason in {out}/<model>/REWRITES.md: {counts} site(s)")


@app.command()
def diff(
    models: list[str] = typer.Argument(None, help="Model types or module names."),
    all_models: bool = typer.Option(False, "--all", help="Every model of the installed transformers."),
    out: Path = typer.Option(None, "--out", help="Write a patch series with PR descriptions here."),
    evidence: Path = typer.Option(
        None, "--evidence", help="The evidence.json of `tools/upstream_evidence.py`, for the PR texts."
    ),
    jobs: int = JOBS,
):
    """Print the upstream patch (paths a/src/transformers/...) for the shared modules and MODELS, or write it to
    OUT as a numbered patch series (`series` gives the order) with a PR description beside each patch."""
    tf = _transformers()
    if all_models == bool(models):
        raise _fail("name the models to diff, or pass --all")
    modules = list(tf.models) if all_models else _modules(tf, models)
    rendered = _render(tf, modules, jobs, no_cache=False)
    if out is None:
        sys.stdout.write("".join(patch_text(changes) for changes in rendered.upstream.values()))
        return
    measured = {}
    if evidence is not None:
        try:
            measured = json.loads(evidence.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise _fail(f"cannot read {evidence}: {error}; run tools/upstream_evidence.py to write it") from None
        if measured.get("transformers") != tf.version:
            raise _fail(
                f"{evidence} was measured on transformers {measured.get('transformers')}, {tf.version} is installed: "
                "run tools/upstream_evidence.py again"
            )
    model_types = {module: list(tf.models[module].model_types) for module in modules}
    files = patch_series(rendered.upstream, measured, model_types, tf.version)
    if evidence is not None and evidence.resolve().parent == out.resolve():
        # the evidence tool writes it into the series it measured: the new series keeps it
        files[evidence.name] = evidence.read_text(encoding="utf-8")
    try:
        write_tree(files, out)
    except OSError as error:
        raise _fail(f"cannot write {out}: {error}") from None
    _say(f"wrote {len(files) // 2} patch(es) with PR descriptions to {out} (order: {out / 'series'})")


@app.command()
def check(
    out: Path = typer.Argument(Path("generated"), help="The generated package directory to check."),
    jobs: int = JOBS,
    no_cache: bool = NO_CACHE,
):
    """Regenerate OUT in memory; exit 1 and show the difference when it is stale."""
    tf = _transformers()
    modules = generated_modules(out)
    if not modules:
        raise _fail(f"{out} holds no generated model")
    built_for = generated_version(out)
    if built_for != tf.version:  # every file differs: the diff would say nothing the versions do not
        _say(
            f"{out} was generated from transformers {built_for or 'an unknown version'}, {tf.version} is installed; "
            f"regenerate it with: exportsmith generate --out {out}"
        )
        raise typer.Exit(1)
    rendered = _render(tf, modules, jobs, no_cache)
    difference = stale_diff(rendered.files, out)
    if difference:
        sys.stdout.write(difference)
        _say(f"{out} is stale for transformers {tf.version}; regenerate it with: exportsmith generate --out {out}")
        raise typer.Exit(1)
    _say(f"{out} is up to date for transformers {tf.version} ({len(modules)} models)")


@app.command()
def rewrite(
    paths: list[Path] = typer.Argument(..., help="Python files (directories: their *.py files), e.g. remote code."),
    codemod: list[str] = typer.Option(None, "--codemod", "-c", help="Apply only this codemod (repeatable)."),
    write: bool = typer.Option(False, "--write", "-w", help="Rewrite the files in place (atomically)."),
    output: Path = typer.Option(None, "-o", "--output", help="Write the rewritten file here (one PATH only)."),
):
    """Apply the codemods to PATHs: print a unified diff (or write in place / to OUTPUT); findings go to stderr.
    Every file is read and parsed before anything is written."""
    by_name = {c.NAME: c for c in ALL_CODEMODS}
    unknown = [name for name in codemod or [] if name not in by_name]
    if unknown:
        raise _fail(f"unknown codemod {unknown[0]!r}; one of: {', '.join(by_name)}")
    selected = tuple(c for c in ALL_CODEMODS if not codemod or c.NAME in codemod)
    if write and output is not None:
        raise _fail("pass --write or -o OUT, not both")
    files = [f for path in paths for f in (sorted(path.rglob("*.py")) if path.is_dir() else [path])]
    if output is not None and len(files) != 1:
        raise _fail(f"-o OUT takes one file; {len(files)} given")
    changes = []
    for path in files:
        try:
            source = path.read_text(encoding="utf-8")
        except USER_ERRORS as error:
            raise _fail(f"cannot read {path}: {error}") from None
        change = run_codemods(source, path.as_posix(), codemods=selected)
        if change.error:
            raise _fail(f"{path}: {change.error}")
        changes.append((path, change))
    for path, change in changes:
        for finding in change.findings:
            _say(str(finding))
        if output is not None:
            _write_atomically(output, change.rewritten)
        elif write:
            if change.changed:
                _write_atomically(path, change.rewritten)
        else:
            sys.stdout.write(change.diff(prefix=""))
        _say(f"{path}: {'rewritten by ' + ', '.join(change.applied) if change.changed else 'unchanged'}")


def _write_atomically(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file in the same directory: readers never see half a file."""
    temporary = path.with_name(f".{path.name}.exportsmith-tmp")
    try:
        temporary.write_text(text, encoding="utf-8")
        if path.exists():
            os.chmod(temporary, path.stat().st_mode)
        os.replace(temporary, path)
    except OSError as error:
        temporary.unlink(missing_ok=True)
        raise _fail(f"cannot write {path}: {error}") from None


SUBJECT_HELP = (
    "What to export: 'generated' (the copies in OUT), 'original' (transformers' classes, no help) or "
    "'dynamo-exporter' (transformers' classes through transformers.exporters.DynamoExporter)."
)


@app.command()
def verify(
    models: list[str] = typer.Argument(None, help="Model types; or --all."),
    all_models: bool = typer.Option(
        False, "--all", help="Every model type OUT holds (every model type of transformers for the other subjects)."
    ),
    out: Path = typer.Option(Path("generated"), "--out", help="The generated package directory to verify."),
    subject: str = typer.Option("generated", "--subject", help=SUBJECT_HELP),
    json_path: Path = typer.Option(
        None,
        "--json",
        help="Run each model in its own process (memory cap, timeout) and append one JSON record per model to this "
        "file; model types already recorded there are skipped, so an interrupted sweep resumes.",
    ),
    jobs: int = typer.Option(1, "--jobs", "-j", help="With --json: models verified at a time."),
    timeout: float = typer.Option(600.0, "--timeout", help="With --json: seconds per model."),
    record: bool = typer.Option(
        False, "--record", help="Write OUT/<model>/VERIFY.json, with the original's export error."
    ),
    onnx: bool = typer.Option(
        False, "--onnx", help="Also export with torch.onnx (dynamo) and compare in onnxruntime."
    ),
    executorch: bool = typer.Option(
        False,
        "--executorch",
        help="Also lower to ExecuTorch (XNNPACK) and compare in the ExecuTorch runtime (the `executorch` extra).",
    ),
    config_path: str = typer.Option(
        None,
        "--config",
        help="Verify at a real configuration instead of the tiny one: a checkpoint's config.json, or the name of one "
        "the project holds (`exportsmith list --real-configs`). Random weights; adds the cases that cross its "
        "sliding window. The model type comes from the config.",
    ),
    layers: int = typer.Option(None, "--layers", help="With --config: keep this many layers (default: a few)."),
):
    """Check models: eager bit-identity of the copy, export with dynamic shapes, the program vs eager at other shapes,
    save/load. Exits 1 when a model fails."""
    from .verify.check import SUBJECTS

    tf = _transformers()
    if subject not in SUBJECTS:
        raise _fail(f"unknown subject {subject!r}; one of: {', '.join(SUBJECTS)}")
    config = None
    if config_path is not None:
        if onnx or executorch:
            raise _fail("--onnx and --executorch check the tiny model: not with --config")
        if models or all_models or json_path is not None or record:
            raise _fail(
                "--config verifies the one model type of the config: no model types, --all, --json or --record"
            )
        config = _real_config(config_path, layers)
        models = [config.model_type]
    elif layers is not None:
        raise _fail("--layers goes with --config")
    if bool(models) == all_models:
        raise _fail("name model types, or pass --all")
    if (record or onnx or executorch) and (subject != "generated" or json_path is not None):
        raise _fail(
            "--record, --onnx and --executorch check generated copies one by one: not with --subject or --json"
        )
    if subject == "generated":
        _package_dir(out)
    if subject == "generated" and not (out / "__init__.py").is_file():
        hint = " ".join(models) if models else "--all"
        raise _fail(f"{out} is not a generated package; run: exportsmith generate {hint} --out {out}")
    if all_models and subject == "generated":
        held = set(generated_modules(out))
        models = sorted(name for name, module in tf.model_types.items() if module in held)
    elif all_models:
        models = sorted(tf.model_types)
    else:
        modules = _modules(tf, models)  # one clear error for unknown names before any model is built
        missing = sorted(set(modules) - set(generated_modules(out))) if subject == "generated" else []
        if missing:
            raise _fail(
                f"{out} holds no {', '.join(missing)}; run first: exportsmith generate {' '.join(missing)} --out {out}"
            )
    if json_path is not None:
        failed = _verify_isolated(models, out, subject, json_path, jobs, timeout)
    else:
        failed = _verify_here(tf, models, out, subject, record, onnx, config, executorch)
    if failed:
        _say(f"{failed} of {len(models)} model(s) failed verification")
        raise typer.Exit(1)
    _say(f"{len(models)} model(s) verified")


def _verify_isolated(models: list[str], out: Path, subject: str, json_path: Path, jobs: int, timeout: float) -> int:
    from functools import partial

    from .verify.isolate import check_export, sweep

    check = partial(check_export, subject=subject, package=out.resolve().name, path=str(out.resolve().parent))
    try:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        records = sweep(models, json_path, check, jobs=jobs, timeout=timeout)
    except OSError as error:
        raise _fail(f"cannot write {json_path}: {error}") from None
    for name in models:
        record = records[name]
        where = f" at {record['details']['location']}" if record.get("details", {}).get("location") else ""
        status = "ok" if record["status"] == "ok" else f"FAIL {record['status']}: {record['reason']}{where}"
        typer.echo(f"{name}: {status}")
    return sum(records[name]["status"] != "ok" for name in models)


def _real_config(name_or_path: str, layers: int | None):
    """The config `--config` names (a config.json, or a name of the project's real configs), `layers` layers."""
    from .verify.real import load_config, real_config

    if layers is not None and layers < 1:
        raise _fail("--layers must be 1 or more")
    try:
        if Path(name_or_path).is_file():
            return load_config(json.loads(Path(name_or_path).read_text(encoding="utf-8")), layers)
        return real_config(name_or_path, layers)
    except LookupError as error:
        raise _fail(f"{error}; or give the path of a config.json") from None
    except (ValueError, KeyError, TypeError) as error:
        raise _fail(f"{name_or_path}: not a transformers config ({error})") from None


def _verify_here(
    tf: Transformers,
    models: list[str],
    out: Path,
    subject: str,
    record: bool,
    onnx: bool,
    config=None,
    executorch: bool = False,
) -> int:
    import torch  # torch is imported only by the commands that need it

    from .verify import verify_model
    from .verify.baseline import original_export_error
    from .verify.executorch_check import MissingExecutorch, require_executorch
    from .verify.onnx_check import MissingOnnxDependencies, require_onnx_packages, verify_onnx

    try:
        if onnx:
            require_onnx_packages()
        if executorch:
            require_executorch()
    except (MissingOnnxDependencies, MissingExecutorch) as error:
        raise _fail(str(error)) from None
    sys.path.insert(0, str(out.resolve().parent))
    failed = 0
    for index, name in enumerate(models, 1):
        _say(f"[{index}/{len(models)}] verifying {name} ...")
        result = verify_model(name, package=out.resolve().name, subject=subject, config=config)
        typer.echo(result.summary)
        ok = result.ok
        if onnx:
            onnx_result = verify_onnx(name, package=out.resolve().name)
            typer.echo(onnx_result.summary)
            ok = ok and onnx_result.ok
        if executorch:
            ok = _verify_executorch(name, out) and ok
        failed += not ok
        if record:
            data = {
                **result.record(),
                "transformers": tf.version,
                "torch": torch.__version__,
                "original_export_error": original_export_error(name),
            }
            path = out / tf.resolve(name).module / "VERIFY.json"
            path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return failed


def _verify_executorch(name: str, out: Path) -> bool:
    """`verify_executorch` in a child process: the ExecuTorch runtime aborts the process on some kernels' failed
    checks, which is then a `crash` with the signal, not the end of the command."""
    from functools import partial

    from .verify.isolate import check_executorch, run_isolated

    check = partial(check_executorch, package=out.resolve().name, path=str(out.resolve().parent))
    record = run_isolated(name, check, timeout=1800.0)
    typer.echo(record.reason if record.status == "ok" else f"{name}: ExecuTorch FAIL {record.status}: {record.reason}")
    return record.status == "ok"


def main() -> None:
    app()
