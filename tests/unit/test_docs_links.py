"""The README, the manual (docs/) and the results files (benchmarks/results/) stay true
to the tree: every relative link reaches a file (and its heading, when it names one),
every repository path they mention exists, the README fits in 300 lines, and the docs
speak of the project, not of the history of its work."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.integration.test_readme_commands import readme_commands
from tests.paths import ROOT

DOCS = sorted(
    [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "benchmarks/results").glob("*.md")]
)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`]+`")
# a path into the repository, as text mentions it (not a part of a longer path)
REPO_PATH = re.compile(
    r"(?<![\w./:-])((?:streamrl|tests|benchmarks|examples|scripts|docs)/[\w./-]*[\w/])"
)
HISTORY = {  # wording about the work on the project, not about the project
    "an issue": re.compile(
        r"\b(?:the|this|that|an|performance|previous|next) issues?\b|\bissues? (?:#|\d)|\bissue's",
        re.I,
    ),
    "an item number": re.compile(r"\bitem \d", re.I),
    "a work session": re.compile(
        r"\b(first|second|third|fourth|fifth|later|last|this|previous|earlier) session\b",
        re.I,
    ),
    "a date": re.compile(r"\b20\d\d-\d\d-\d\d\b"),
}


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    found: set[str] = set(re.findall(r"<a (?:id|name)=\"([^\"]+)\"", text))
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.M):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def test_slug_follows_github() -> None:
    assert slug("Exactness at η = 0") == "exactness-at-η--0"
    assert (
        slug("Compiled decode steps: `rollout.compile`") == "compiled-decode-steps-rolloutcompile"
    )
    assert slug("streamrl data log-completions") == "streamrl-data-log-completions"


@pytest.mark.parametrize("doc", DOCS, ids=rel)
def test_every_relative_link_resolves(doc: Path) -> None:
    broken = []
    for target in LINK.findall(FENCE.sub("", doc.read_text())):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {rel(file)}")
    assert not broken, f"{rel(doc)}: broken links:\n" + "\n".join(broken)


@pytest.mark.parametrize("doc", DOCS, ids=rel)
def test_every_repository_path_exists(doc: Path) -> None:
    missing = sorted({p for p in REPO_PATH.findall(doc.read_text()) if not (ROOT / p).exists()})
    assert not missing, f"{rel(doc)} names paths that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=rel)
def test_the_docs_speak_of_the_project_not_of_its_history(doc: Path) -> None:
    prose = CODE_SPAN.sub("", FENCE.sub("", doc.read_text()))
    found = [
        f"{what}: {line.strip()}"
        for line in prose.splitlines()
        for what, pattern in HISTORY.items()
        if pattern.search(line)
    ]
    assert not found, f"{rel(doc)}:\n" + "\n".join(found)


def test_commands_md_documents_every_readme_command() -> None:
    headings = set(re.findall(r"^## (.+)$", (ROOT / "docs/commands.md").read_text(), re.M))
    for command in readme_commands():
        words = [w for w in command.split() if not w.startswith("--")]  # train --resume: train
        name = " ".join(words) if words[0] == "python" else "streamrl " + " ".join(words)
        documented = any(name == h or name.startswith(h + " ") for h in headings)
        assert documented, f"docs/commands.md has no section '## {name}'"


def test_the_readme_fits_in_300_lines() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 300


def test_the_checks_catch_what_they_look_for(tmp_path: Path) -> None:
    """The patterns above find what they are for (a check that finds nothing proves nothing)."""
    assert REPO_PATH.findall("see `tests/unit/x.py::test_y` and streamrl/core/types.py.") == [
        "tests/unit/x.py",
        "streamrl/core/types.py",
    ]
    assert not REPO_PATH.findall("git show abc:streamrl/old.py and /tmp/tests/x")
    assert HISTORY["a date"].search("measured 2026-11-27") and HISTORY["an item number"].search(
        "item 4's target"
    )
    assert HISTORY["an issue"].search("the performance issue's target")
    assert HISTORY["an issue"].search("item 1 of issue 13")
    assert not HISTORY["an issue"].search("the pool issues every issued item, or re-issues it")
    assert HISTORY["a work session"].search("measured in a fifth session")
    assert not HISTORY["a work session"].search("a session is one item of the stream")
    doc = tmp_path / "a.md"
    doc.write_text('# Title: one `x`\n\n## Title: one `x`\n<a id="here"></a>\n')
    assert anchors(doc) == {"title-one-x", "title-one-x-1", "here"}
