"""The docs: generated parts current and complete (results/README.md's key tables, docs/flags.md,
the README's flag table), the README a short front door, and every relative link resolving."""

import re
from pathlib import Path

import pandas as pd
import pytest

from testbed.analysis.keys import EVENT_COLUMNS, STEP_COLUMNS, UPDATE_COLUMNS, documented
from testbed.analysis.records import EVENT_COLUMNS as EVENTS
from testbed.analysis.records import STEP_COLUMNS as STEPS
from testbed.analysis.records import UPDATE_COLUMNS as UPDATES
from testbed.config import RunConfig, build_parser, with_overrides
from testbed.docs import generate as docs
from testbed.session.execute import summarize_run
from testbed.strategies.registry import SPECS

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("path", list(docs.PAGES), ids=lambda p: str(p.relative_to(ROOT)))
def test_generated_parts_are_current(path):
    current, fresh = docs.rendered(path)
    assert current == fresh, f"{path.relative_to(ROOT)} is out of date: run python -m testbed.docs"


def test_check_exits_1_naming_a_stale_page(tmp_path, monkeypatch, capsys):
    page = tmp_path / "flags.md"
    page.write_text("# hand-edited\n")
    monkeypatch.setattr(docs, "ROOT", tmp_path)
    monkeypatch.setattr(docs, "PAGES", {page: lambda text: docs.flags_page()})
    assert docs.main(["--check"]) == 1
    assert "flags.md is out of date" in capsys.readouterr().err
    assert page.read_text() == "# hand-edited\n"
    assert docs.main([]) == 0 and docs.main(["--check"]) == 0


def test_flags_page_lists_every_flag_with_its_key():
    page = docs.flags_page()
    for action in build_parser(SPECS)._actions:
        for flag in action.option_strings:
            if flag not in ("-h", "--help"):
                assert f"`{flag}" in page, flag
        if action.dest != "help":
            assert f"| `{action.dest}` |" in page, action.dest


@pytest.mark.parametrize("text, split", [
    ("workers (default: 4)", ("workers", "4")),
    ("clock bound s (default: none) [ps-async]", ("clock bound s [ps-async]", "none")),
    ("share (default: 1 (one) or more)", ("share", "1 (one) or more")),
    ("no default here", ("no default here", "")),
])
def test_a_help_text_splits_into_meaning_and_default(text, split):
    assert docs._split_default(text) == split


def _outside_code(text):
    """TEXT without its fenced code blocks and inline code spans."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def _headings(path):
    """(level, anchor) of a markdown page's headings, the anchor as GitHub makes it."""
    seen, out = {}, []
    for line in re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S).splitlines():
        m = re.match(r"(#{1,6}) (.*)", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(2).strip().lower()).replace(" ", "-")
            out.append((len(m.group(1)), slug if slug not in seen else f"{slug}-{seen[slug]}"))
            seen[slug] = seen.get(slug, 0) + 1
    return out


def _anchors(path):
    return {anchor for _, anchor in _headings(path)}


def _links(path):
    return re.findall(r"\]\(([^)\s]+)\)", _outside_code(path.read_text()))


def test_readme_is_a_front_door():
    lines = README.read_text().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; move detail into docs/"
    contents = README.read_text().split("## Contents", 1)[1].split("\n## ", 1)[0]
    targets = re.findall(r"\]\(#([^)]+)\)", contents)
    assert targets and set(targets) <= _anchors(README), set(targets) - _anchors(README)
    sections = {anchor for level, anchor in _headings(README) if level > 1 and anchor != "contents"}
    assert sections <= set(targets), f"headings missing from the README's contents: {sections - set(targets)}"


def test_every_docs_page_is_one_click_from_the_readme():
    linked = {(README.parent / t.split("#")[0]).resolve() for t in _links(README)}
    pages = {p.resolve() for p in (ROOT / "docs").glob("*.md")}
    pages |= {(ROOT / "docs" / name).resolve() for name in ("testing.md", "gpu.md", "flags.md")}
    assert not pages - linked, sorted(str(p.relative_to(ROOT)) for p in pages - linked)


@pytest.mark.parametrize("path", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path):
    broken = []
    for target in _links(path):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(target)
    assert not broken, f"{path.relative_to(ROOT)}: {broken}"


def test_every_record_column_is_documented():
    assert tuple(STEP_COLUMNS) == STEPS
    assert tuple(UPDATE_COLUMNS) == UPDATES
    assert tuple(EVENT_COLUMNS) == EVENTS


def _records(n=2, steps=3):
    rows = [{"run_id": "r", "strategy": "ps-sync", "worker": w, "iteration": i, "version_read": i,
             "version_applied": i, "t_start": 10.0 + i, "compute_s": 0.1, "comm_s": 0.2, "wait_s": 0.0,
             "bytes_sent": 100, "bytes_recv": 100, "samples": 8, "loss": 1.0, "staleness": 0,
             "injected_delay_s": 0.0, "late_s": 0.0} for i in range(steps) for w in range(n)]
    ups = [{"version": i + 1, "t_applied": 10.5 + i, "contributors": n, "dropped": 0, "loss": 1.0}
           for i in range(steps)]
    return pd.DataFrame(rows), pd.DataFrame(ups)


def test_every_key_a_summary_can_have_is_documented():
    steps, updates = _records()
    extra = {"grad_bytes_logical": 4096, "faults": []}
    for net in ({}, {"network.bandwidth": "1Gbit"}):
        for name, spec in SPECS.items():
            if name == "allreduce-torch" and net:
                continue
            cfg = with_overrides(RunConfig(strategy=name, workers=2), **net)
            own = {k: 1 for k in spec.summary_keys if k != "grad_bytes_logical"}
            summary = summarize_run(spec, cfg, steps, updates, {**own, **extra}, "completed")
            summary.update(run_id="r", elapsed_s=1.0, startup_s=0.1, schema_version=1)
            missing = set(summary) - documented(SPECS)
            assert not missing, f"{name}: undocumented summary keys {sorted(missing)}"
    empty = summarize_run(SPECS["ring"], RunConfig(), steps.iloc[:0], updates.iloc[:0], {}, "failed")
    assert set(empty) <= documented(SPECS)
