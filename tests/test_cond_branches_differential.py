"""Every `if` that cond-branches rewrites, as `exportsmith generate --all` rewrites it, runs the same in eager.

For each modeling and modular file of the installed transformers (the files `generate --all` renders; shared modules
are never changed by cond-branches), the codemods that come before cond-branches run first, then cond-branches: the
difference between the two texts is cond-branches' alone. `rewritten_regions` pairs each run of statements it
replaced with its replacement, and `compare_region` runs both on recording proxies on every arm (see
`rewritten_regions` and `recording_proxy`): the names bound that code after them may read and their values, the
returned value or the exception, and the truth tests and numbers asked of the proxies must be equal. The fixture
inputs of `fixtures/cond_branches/` go through the same check.

A site whose original the proxies cannot run on some arm is counted and listed, not skipped: the list is pinned for
transformers 5.24.0. The codemods run once per file (~870 files: about 95 s of CPU, ~3 min on a busy two-core
machine): marked `slow`, which the default `pytest -q` runs (`-m "not slow"` leaves it out).
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from codemods import ALL_CODEMODS
from codemods.cond_branches import CondBranches, load_targets
from exportsmith.discover import find_transformers
from exportsmith.pipeline import run_codemods
from rewritten_regions import compare_region, rewritten_regions

FIXTURES = Path(__file__).parent / "fixtures" / "cond_branches"
BEFORE_COND = ALL_CODEMODS[: ALL_CODEMODS.index(CondBranches)]
PINNED_VERSION = "5.24.0"
# Sites (file:line) whose original the proxies cannot run on every arm, and why (transformers 5.24.0)
NOT_RUN_524: dict[str, str] = {}


@dataclass
class Site:
    """One rewritten `if` (a finding), in the text cond-branches read."""

    relpath: str
    line: int
    construct: str


@dataclass
class Comparison:
    sites: list[Site] = field(default_factory=list)
    exercised: list[Site] = field(default_factory=list)
    not_run: dict[str, str] = field(default_factory=dict)  # "file:line" -> why
    mismatches: list[str] = field(default_factory=list)
    unplaced: list[str] = field(default_factory=list)  # findings outside every region, regions without a finding
    runs: int = 0
    seconds: float = 0.0  # CPU, codemods included
    comparing: float = 0.0  # CPU spent running regions on proxies


def _compare_file(relpath: str, before: str, after: str, findings, into: Comparison) -> None:
    rewritten = [f for f in findings if f.codemod == CondBranches.NAME and f.kind == "rewritten"]
    sites = [Site(relpath, finding.line, finding.construct) for finding in rewritten]
    if not sites:
        return
    into.sites.extend(sites)
    regions = rewritten_regions(before, after)
    placed = set()
    for region in regions:
        first, last = region.lines
        held = [site for site in sites if first <= site.line <= last]
        if not held:
            into.unplaced.append(f"{relpath}:{first}-{last}: a replaced region without a rewritten site")
            continue
        placed.update(id(site) for site in held)
        start = time.process_time()
        result = compare_region(region)
        into.comparing += time.process_time() - start
        into.runs += result.paths
        for mismatch in result.mismatches:
            into.mismatches.append(f"{relpath}:{first} ({', '.join(s.construct for s in held)}): {mismatch}")
        if result.fully_run:
            into.exercised.extend(held)
        else:
            for site in held:
                into.not_run[f"{relpath}:{site.line}"] = result.limits[0]
    into.unplaced.extend(f"{s.relpath}:{s.line}: a site outside every region" for s in sites if id(s) not in placed)


def _texts_around_cond_branches(source: str, relpath: str, name: str):
    """(the text cond-branches reads, the text it writes, its findings) as the pipeline runs it, or None when it
    changes nothing."""
    through = run_codemods(source, relpath, name, (*BEFORE_COND, CondBranches))
    if CondBranches.NAME not in through.applied:
        return None
    before = source
    if set(through.applied) - {CondBranches.NAME}:
        before = run_codemods(source, relpath, name, BEFORE_COND).rewritten
    return before, through.rewritten, through.findings


def _without_cyclic_gc(function, *args):
    """`function(*args)` with the cyclic collector paused, as `exportsmith generate` renders (it would rescan the
    parsed trees for nothing); the youngest generation, which holds what the call left, is collected after."""
    gc.disable()
    try:
        return function(*args)
    finally:
        gc.collect(0)
        gc.enable()


@pytest.fixture(scope="session")
def transformers_comparison() -> Comparison:
    """The comparison of every site of the installed transformers, with the codemods run once per file."""
    start = time.process_time()
    tf = find_transformers()
    comparison = Comparison()
    for module in sorted(tf.models):
        model = tf.models[module]
        for path in (*model.modeling, *model.modular):
            source, relpath, name = path.read_text(encoding="utf-8"), tf.relpath(path), tf.module_name(path)
            texts = _without_cyclic_gc(_texts_around_cond_branches, source, relpath, name)
            if texts is not None:
                _compare_file(relpath, *texts, comparison)
    comparison.seconds = time.process_time() - start
    return comparison


def _report(label: str, comparison: Comparison) -> str:
    return (
        f"{label}: {len(comparison.exercised)}/{len(comparison.sites)} rewritten sites exercised on every arm "
        f"({comparison.runs} runs compared), {len(comparison.not_run)} not run, {comparison.seconds:.1f} s CPU "
        f"({comparison.comparing:.1f} s running them)"
    )


def _check(comparison: Comparison) -> None:
    assert not comparison.unplaced, "\n".join(comparison.unplaced)
    assert not comparison.mismatches, "\n\n".join(comparison.mismatches[:20])


@pytest.mark.slow
def test_every_site_rewritten_in_transformers_runs_the_same_in_eager(transformers_comparison, capsys):
    comparison = transformers_comparison
    with capsys.disabled():
        print(f"\n{_report('transformers ' + find_transformers().version, comparison)}")
    _check(comparison)
    assert comparison.sites, "no rewritten site: the differential test compares nothing"
    if find_transformers().version == PINNED_VERSION:
        assert comparison.not_run == NOT_RUN_524


def _fixture_comparison() -> Comparison:
    comparison = Comparison()
    start = time.process_time()
    for path in sorted(FIXTURES.glob("*.in.py")):
        case = path.name.removesuffix(".in.py")
        if case == "shared_module":
            continue  # a shared module: never rewritten
        codemod = CondBranches
        targets = path.with_name(f"{case}.targets.json")
        if targets.exists():
            codemod = CondBranches.with_targets(load_targets(targets))
        source = path.read_text()
        change = run_codemods(source, path.name, "transformers.models.toy.modeling_toy", (codemod,))
        _compare_file(path.name, source, change.rewritten, change.findings, comparison)
    comparison.seconds = time.process_time() - start
    return comparison


def test_every_site_rewritten_in_the_fixtures_runs_the_same_in_eager(capsys):
    comparison = _fixture_comparison()
    with capsys.disabled():
        print(f"\n{_report('fixtures', comparison)}")
    _check(comparison)
    assert not comparison.not_run, comparison.not_run
    assert comparison.sites


_ELIF_CHAIN = """
def f(x):
    s = x.sum()
    if s > 10:
        y = x * 2
    elif s > 0:
        y = x + 1
    else:
        y = x - 1
    return y
"""
# What cond-branches made of it before operands came from a definite-assignment analysis (main at 01ba0ad)
_ELIF_CHAIN_WITH_AN_UNBOUND_OPERAND = """
def f(x):
    s = x.sum()

    def true_fn():
        return x * 2

    def false_fn():
        def true_fn(y):
            return x + 1

        def false_fn(y):
            return x - 1

        if torch.compiler.is_exporting():
            y = torch.cond(s > 0, true_fn, false_fn, (y,))
        elif s > 0:
            y = true_fn(y)
        else:
            y = false_fn(y)
        return y

    if torch.compiler.is_exporting():
        y = torch.cond(s > 10, true_fn, false_fn, ())
    elif s > 10:
        y = true_fn()
    else:
        y = false_fn()
    return y
"""


def test_the_comparison_sees_an_operand_that_is_unbound_in_an_arm_function():
    (region,) = rewritten_regions(_ELIF_CHAIN, _ELIF_CHAIN_WITH_AN_UNBOUND_OPERAND)
    result = compare_region(region)
    assert result.fully_run and result.paths == 3
    # the `elif` and the `else` paths: `y` is read in `false_fn` before anything binds it there
    assert len(result.mismatches) == 2
    assert all("kind='raised', payload=('NameError', 'y')" in mismatch for mismatch in result.mismatches)


def test_the_comparison_sees_an_operand_bound_on_some_paths_only():
    # main's rewrite of a one-armed `if` whose result an earlier one-armed `if` binds
    original = "def f(x, flag):\n    if flag:\n        y = x\n    if (x > 0).all():\n        y = x + 1\n    return y\n"
    broken = original.replace(
        "    if (x > 0).all():\n        y = x + 1\n",
        "    def true_fn(y):\n        return x + 1\n    if torch.compiler.is_exporting():\n"
        "        y = torch.cond((x > 0).all(), true_fn, lambda y: y.clone(), (y,))\n"
        "    elif (x > 0).all():\n        y = true_fn(y)\n",
    )
    (region,) = rewritten_regions(original, broken)
    result = compare_region(region)
    # `y` unbound (flag false) and the arm taken: the original binds it, the rewritten reads it first
    assert [m for m in result.mismatches if "unbound ['y']" in m and "answers [True]" in m]
    assert not [m for m in result.mismatches if "unbound []" in m]


def test_a_region_the_proxies_cannot_run_is_counted_not_compared():
    original = "def f(x, mask):\n    if mask.any():\n        x = torch.stack([row * 2 for row in x])\n    return x\n"
    rewritten = original.replace("row * 2", "2 * row")
    (region,) = rewritten_regions(original, rewritten)
    result = compare_region(region)
    assert not result.fully_run and result.limits == ["iteration of `x` (not unpacking into names)"]
    assert not result.mismatches  # the run that could not go on is not compared
