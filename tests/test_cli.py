"""The CLI through typer's CliRunner (plus one real subprocess): outputs, errors and exit codes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from exportsmith.cli import app
from exportsmith.discover import find_transformers

ROOT = Path(__file__).parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "cache_pytree" / "remote_code.in.py"
TF_VERSION = find_transformers().version


def run(*args: str):
    return CliRunner().invoke(app, list(args))


def test_list_shows_every_codemod_with_its_description():
    result = run("list")
    assert result.exit_code == 0
    assert result.stdout.startswith("cache-pytree\tRegisters Cache classes")


def test_list_models_names_modules_and_their_types():
    result = run("list", "--models")
    assert result.exit_code == 0
    assert "\nllama\tllama\n" in result.stdout


def test_unknown_model_is_a_one_line_error_with_suggestions(tmp_path):
    for command in (["generate", "lama", "--out", str(tmp_path / "g")], ["diff", "lama"], ["verify", "lama"]):
        result = run(*command)
        assert result.exit_code == 2, command
        assert result.stderr.strip().splitlines() == [
            f"error: unknown model 'lama' in transformers {find_transformers().version}; did you mean llama, mllama, llama4?"
        ]
    assert not (tmp_path / "g").exists()  # nothing half-written


def test_generate_then_check_then_stale(tmp_path):
    out = tmp_path / "generated"
    assert run("generate", "gpt2", "--out", str(out)).exit_code == 0
    assert (out / "gpt2" / "modeling_gpt2.py").is_file() and (out / "_shared" / "cache_utils.py").is_file()
    result = run("check", str(out))
    assert result.exit_code == 0 and "up to date" in result.stderr
    (out / "gpt2" / "modeling_gpt2.py").write_text("# edited\n")
    result = run("check", str(out))
    assert result.exit_code == 1
    assert "-# edited" in result.stdout and "is stale" in result.stderr


def test_check_of_a_directory_without_models_fails(tmp_path):
    result = run("check", str(tmp_path))
    assert result.exit_code == 2 and "holds no generated model" in result.stderr


def test_diff_prints_the_upstream_patch():
    result = run("diff", "minimax")
    assert result.exit_code == 0
    assert "diff --git a/src/transformers/cache_utils.py b/src/transformers/cache_utils.py" in result.stdout
    # the upstream form: counters for transformers' exporters, no registration of its own
    assert "diff --git a/src/transformers/exporters/exporter_dynamo.py" in result.stdout
    assert '+    _export_counters = ("cumulative_length",)' in result.stdout
    assert "register_cache_pytree_node" not in result.stdout
    assert "diff --git a/src/transformers/models/minimax/modeling_minimax.py" in result.stdout  # its MoE loop


def test_diff_puts_the_evidence_of_the_installed_release_into_the_pr_texts(tmp_path):
    import json

    from exportsmith.discover import find_transformers

    version = find_transformers().version
    after = {"ok": True, "failure": None, "cases": 1, "max_diff": 1e-6}
    before = {"ok": False, "failure": "export-error", "message": "decode: boom"}
    assert run("diff", "minimax", "--out", str(tmp_path / "series")).exit_code == 0
    (patch,) = (tmp_path / "series").glob("*-moe-expert-loop.patch")
    stem = patch.name.removesuffix(".patch")
    assert "Not measured yet" in (tmp_path / "series" / f"{stem}.md").read_text()
    data = {
        "transformers": version,
        "torch": "2.13.0",
        "patches": {stem: {"minimax": {"before": before, "after": after}}},
    }
    evidence = tmp_path / "evidence.json"
    evidence.write_text(json.dumps(data))
    result = run("diff", "minimax", "--out", str(tmp_path / "series"), "--evidence", str(evidence))
    assert result.exit_code == 0, result.output
    text = (tmp_path / "series" / f"{stem}.md").read_text()
    assert "| minimax | export-error: `decode: boom` | verified | 1 | 1e-06 |" in text
    # the evidence tool writes it into the series it measured: rewriting that series keeps it
    inside = tmp_path / "series" / "evidence.json"
    inside.write_text(json.dumps(data))
    assert run("diff", "minimax", "--out", str(tmp_path / "series"), "--evidence", str(inside)).exit_code == 0
    assert json.loads(inside.read_text()) == data
    evidence.write_text(json.dumps({**data, "transformers": "4.0.0"}))
    result = run("diff", "minimax", "--out", str(tmp_path / "other"), "--evidence", str(evidence))
    assert result.exit_code != 0
    assert "measured on transformers 4.0.0" in result.output and "tools/upstream_evidence.py" in result.output
    assert not (tmp_path / "other").exists()


def test_rewrite_prints_a_diff_or_writes_and_reports_findings(tmp_path):
    result = run("rewrite", str(FIXTURE))
    assert result.exit_code == 0
    rewritten = FIXTURE.with_name("remote_code.out.py").read_text()
    assert result.stdout.startswith(f"diff --git a/{FIXTURE.as_posix()} b/{FIXTURE.as_posix()}\n")
    assert "+@register_cache_pytree_node" in result.stdout
    assert "rewritten class RemoteCache" in result.stderr
    out = tmp_path / "out.py"
    assert run("rewrite", str(FIXTURE), "-o", str(out)).exit_code == 0
    assert out.read_text() == rewritten


def test_rewrite_write_in_place_with_a_chosen_codemod(tmp_path):
    source = (ROOT / "tests" / "fixtures" / "cond_branches" / "select_shapes.in.py").read_text()
    target = tmp_path / "pkg" / "model.py"
    target.parent.mkdir()
    target.write_text(source)
    untouched = tmp_path / "pkg" / "plain.py"
    untouched.write_text("x = 1\n")
    # cache-pytree alone finds nothing here
    assert run("rewrite", str(target), "--codemod", "cache-pytree", "--write").exit_code == 0
    assert target.read_text() == source
    result = run("rewrite", str(tmp_path / "pkg"), "--codemod", "cond-branches", "--write")
    assert result.exit_code == 0 and result.stdout == ""
    assert "torch.cond(" in target.read_text() and untouched.read_text() == "x = 1\n"
    assert sorted(p.name for p in target.parent.iterdir()) == ["model.py", "plain.py"]  # no temporary left
    # A second run changes nothing: the diff is empty
    again = run("rewrite", str(target))
    assert again.exit_code == 0 and again.stdout == ""


def test_rewrite_of_bad_input_is_a_one_line_error(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("def f(:\n")
    good = tmp_path / "good.py"
    good.write_text((ROOT / "tests" / "fixtures" / "cond_branches" / "select_shapes.in.py").read_text())
    before = good.read_text()
    for args in (
        [str(broken)],
        [str(tmp_path / "missing.py")],
        [str(good), str(broken), "--write"],  # nothing is written when one input is bad
        [str(good), "--codemod", "no-such-codemod"],
        [str(good), str(good), "-o", str(tmp_path / "out.py")],
    ):
        result = run("rewrite", *args)
        assert result.exit_code == 2, args
        assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("error: "), args
    assert good.read_text() == before


def test_verify_needs_a_generated_package(tmp_path):
    result = run("verify", "llama", "--out", str(tmp_path / "nowhere"))
    assert result.exit_code == 2 and "is not a generated package" in result.stderr


def test_the_console_script_runs():
    exe = shutil.which("exportsmith", path=str(Path(sys.executable).parent))
    result = subprocess.run([exe, "list"], capture_output=True, text=True)
    assert result.returncode == 0 and "cache-pytree" in result.stdout


def test_generate_needs_models_or_all(tmp_path):
    for args in ([], ["llama", "--all"]):
        result = run("generate", *args, "--out", str(tmp_path / "g"))
        assert result.exit_code == 2 and "or pass --all" in result.stderr


def test_regenerating_an_up_to_date_directory_writes_nothing(tmp_path):
    out = tmp_path / "generated"
    assert run("generate", "gpt2", "--out", str(out)).exit_code == 0
    stamp = (out / "gpt2" / "modeling_gpt2.py").stat().st_mtime_ns
    result = run("generate", "gpt2", "--out", str(out))
    assert result.exit_code == 0 and "already up to date" in result.stderr
    assert (out / "gpt2" / "modeling_gpt2.py").stat().st_mtime_ns == stamp


def test_verify_needs_models_or_all_and_a_known_subject():
    for args in ([], ["llama", "--all"], ["llama", "--subject", "nobody"]):
        result = run("verify", *args)
        assert result.exit_code == 2, args
        assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("error: ")


def test_verify_json_isolates_each_model_records_it_and_resumes(tmp_path):
    records = tmp_path / "original.jsonl"
    result = run("verify", "bert", "llama", "--subject", "original", "--json", str(records))
    assert result.exit_code == 1  # the original llama does not export
    lines = [json.loads(line) for line in records.read_text().splitlines()]
    by_type = {line["model_type"]: line for line in lines}
    assert set(by_type) == {"bert", "llama"}
    assert by_type["bert"]["status"] == "ok" and by_type["bert"]["details"]["cases"]
    assert by_type["llama"]["status"] == "export-error" and "DynamicCache" in by_type["llama"]["reason"]
    assert "llama: FAIL export-error: " in result.stdout and "bert: ok" in result.stdout
    again = run("verify", "bert", "--subject", "original", "--json", str(records))
    assert again.exit_code == 0 and again.stdout == "bert: ok\n"
    assert len(records.read_text().splitlines()) == 2  # recorded types are not checked again


# Rough edges a new user met (each reproduced before its fix)


def test_check_under_another_transformers_names_both_versions_and_generate_without_models_regenerates(tmp_path):
    out = tmp_path / "generated"
    assert run("generate", "gpt2", "--out", str(out)).exit_code == 0
    init = out / "__init__.py"
    init.write_text(init.read_text().replace(f"transformers {TF_VERSION}", "transformers 4.57.6"))
    result = run("check", str(out))
    assert result.exit_code == 1 and result.stdout == ""  # no file-by-file diff of a whole release
    assert result.stderr.strip().splitlines() == [
        f"{out} was generated from transformers 4.57.6, {TF_VERSION} is installed; "
        f"regenerate it with: exportsmith generate --out {out}"
    ]
    result = run("generate", "--out", str(out))  # the command check names: the models OUT holds
    assert result.exit_code == 0 and f"generated 1 model(s) from transformers {TF_VERSION}" in result.stderr
    assert run("check", str(out)).exit_code == 0


def test_generate_summary_says_what_it_did_and_counts_the_refusals(tmp_path):
    out = tmp_path / "generated"
    first = run("generate", "wav2vec2", "--out", str(out))
    again = run("generate", "wav2vec2", "--out", str(out))
    assert first.exit_code == again.exit_code == 0
    assert "rewritten" not in again.stderr  # "already up to date ... N module(s) rewritten" read as a contradiction
    assert again.stderr.startswith(f"{out} already up to date: 1 model(s) from transformers {TF_VERSION} (")
    refusals = sum(text.count("] refused ") for text in (p.read_text() for p in sorted(out.glob("*/REWRITES.md"))))
    assert refusals > 0
    summary = [line for line in first.stderr.splitlines() if line.startswith("left as they were")]
    assert len(summary) == 1
    counted = sum(
        int(part.rsplit(" ", 1)[1]) for part in summary[0].split(": ", 1)[1].removesuffix(" site(s)").split(", ")
    )
    assert counted == refusals


def test_generate_of_a_composite_model_also_generates_the_models_it_is_built_from(tmp_path):
    """qwen2_audio builds its language model with `AutoModelForCausalLM.from_config(text_config)`, a qwen2 model:
    generated alone, its copy would run transformers' own qwen2, which no codemod touched (measured: `verify
    qwen2_audio` then failed `Guard failed: attention_mask.size()[1] >= 4` in transformers' masking_utils)."""
    out = tmp_path / "generated"
    result = run("generate", "qwen2_audio", "--out", str(out))
    assert result.exit_code == 0, result.stderr
    assert "with the models they are built from: qwen2 (qwen2_audio)" in result.stderr
    assert sorted(p.name for p in out.iterdir() if (p / "__init__.py").is_file() and p.name != "_shared") == [
        "qwen2",
        "qwen2_audio",
    ]
    assert run("generate", "llama", "--out", str(tmp_path / "plain")).stderr.count("built from") == 0


def test_verify_of_a_model_not_generated_says_to_generate_it(tmp_path):
    out = tmp_path / "generated"
    assert run("generate", "gpt2", "--out", str(out)).exit_code == 0
    result = run("verify", "gemma2", "--out", str(out))
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        f"error: {out} holds no gemma2; run first: exportsmith generate gemma2 --out {out}"
    ]


def test_an_out_directory_that_cannot_be_imported_as_its_package_is_refused(tmp_path):
    for name, why in (("my-gen.v1", "cannot be imported as a Python package"), ("torch", "would hide the installed")):
        out = tmp_path / "build" / name
        for command in (["generate", "gpt2"], ["verify", "gpt2"]):
            result = run(*command, "--out", str(out))
            assert result.exit_code == 2, (name, command)
            lines = result.stderr.strip().splitlines()
            assert len(lines) == 1 and why in lines[0] and lines[0].startswith("error: "), (name, command)
        assert not out.exists()


def test_a_type_without_a_modeling_file_is_named_as_such():
    result = run("generate", "exaone")  # its folder holds a configuration and a modular file, no modeling file
    assert result.exit_code == 2
    (line,) = result.stderr.strip().splitlines()
    assert "'exaone' has no PyTorch modeling file of its own" in line and "did you mean" not in line


def test_a_model_the_codemods_leave_unchanged_has_no_empty_patch(tmp_path):
    out = tmp_path / "generated"
    assert run("generate", "llama", "mixtral", "--out", str(out)).exit_code == 0
    assert not (out / "llama" / "upstream.patch").exists()
    patch = out / "mixtral" / "upstream.patch"
    assert patch.read_text().startswith("diff --git a/src/transformers/models/mixtral/")


def test_runtime_checks_are_refused_where_they_would_check_something_else():
    for args, says in [
        (("--executorch", "--subject", "original"), "not with --subject or --json"),
        (("--onnx", "--json", "records.jsonl"), "not with --subject or --json"),
        (("--executorch", "--config", "openai-community--gpt2"), "check the tiny model: not with --config"),
    ]:
        result = run("verify", *([] if "--config" in args else ["llama"]), *args)
        assert result.exit_code == 2, args
        assert says in result.stderr and "Traceback" not in result.stderr, args
