"""README.md and docs/*.md name only things that exist.

Checked in every document:
- each path `marble/...` (a file, a folder, or a glob such as `marble/presets/*.yaml`), and
  each `workflow/...`, `config/...`, `slurm/...`, `tests/...`, `docs/...` path in code;
- each dotted name `marble.a.b[.attr]`: the module exists, and a trailing attribute is defined
  (or imported) at module level there, so a renamed constant or function fails here;
- each `python -m marble...` / `-m marble...`: the module exists and runs under `-m`;
- each `marble <cmd> [sub] [--flag ...]` in code (inline or fenced): the command is in
  `marble.cli.COMMANDS`, the subcommand is one of its choices, and each flag is one its
  `--help` lists.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

from marble.cli import COMMANDS
from marble.cli import main as marble_main

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PATH = re.compile(r"(?<![\w/.-])marble/[\w./*-]*")
DOTTED = re.compile(r"(?<![\w/.-])marble(?:\.\w+)+")
PYTHON_M = re.compile(r"-m\s+(marble(?:\.\w+)*)")
PATH_NAME = re.compile(r"(?<![\w/.-])(marble/[\w/]+\.py): ?([A-Za-z_]\w*)")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
COMMAND = re.compile(r"(?:^|[\s(|;&])marble\s+([a-z][\w-]*)((?:\s+[^\s`|;&]+)*)")


def doc_text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def code_fragments(text: str) -> list[str]:
    """Inline code spans and the lines of fenced blocks: where commands are written."""
    fenced, rest, inside = [], [], False
    for line in text.splitlines():
        if line.strip().startswith("```"):
            inside = not inside
            continue
        (fenced if inside else rest).append(line)
    return fenced + CODE_SPAN.findall("\n".join(rest))


def module_file(dotted: str) -> Path | None:
    base = ROOT.joinpath(*dotted.split("."))
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


@functools.lru_cache(maxsize=None)
def module_names(path: Path) -> frozenset[str]:
    """Names bound at module level: defs, classes, assignments, imports."""
    names = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.If, ast.Try, ast.For)):  # e.g. a registry loop
            names.update(n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store))
    if "__getattr__" in names:  # a module-level __getattr__ serves the names its __all__ lists
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__"
                                                    for t in node.targets):
                names.update(c.value for c in ast.walk(node.value)
                             if isinstance(c, ast.Constant) and isinstance(c.value, str))
    return frozenset(names)


def dotted_problem(dotted: str) -> str | None:
    """None when `marble.a.b[.attr[.attr2]]` exists, else what is missing."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        path = module_file(".".join(parts[:cut]))
        if path is None:
            continue
        rest = parts[cut:]
        if rest and rest[0] not in module_names(path):
            return f"{'.'.join(parts[:cut])} defines no {rest[0]!r}"
        return None
    return "no such module"


def runs_under_m(dotted: str) -> bool:
    path = module_file(dotted)
    if path is None:
        return False
    if path.name == "__init__.py":
        return (path.parent / "__main__.py").is_file()
    return "__main__" in path.read_text(encoding="utf-8")


def all_docs_findings(pattern: re.Pattern, where=doc_text) -> list[tuple[str, str]]:
    out = []
    for doc in DOCS:
        text = where(doc)
        chunks = text if isinstance(text, list) else [text]
        for chunk in chunks:
            out += [(doc.name, m.group(1) if m.groups() else m.group(0)) for m in pattern.finditer(chunk)]
    return out


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_marble_path_exists(doc):
    missing = []
    for match in PATH.finditer(doc_text(doc)):
        rel = match.group(0).rstrip(".,:;)")
        if not (list(ROOT.glob(rel)) if "*" in rel else (ROOT / rel).exists()):
            missing.append(rel)
    assert not missing, f"{doc.name} names paths that do not exist: {sorted(set(missing))}"
    # `marble/x.py: name` points at a definition in that file
    undefined = [f"{rel}: {name}" for rel, name in PATH_NAME.findall(doc_text(doc))
                 if (ROOT / rel).is_file() and name not in module_names(ROOT / rel)]
    assert not undefined, f"{doc.name} names definitions that do not exist: {undefined}"


REPO_PATH = re.compile(r"`((?:workflow|config|slurm|tests|docs)/[\w./*-]*)`?")


@pytest.mark.parametrize("doc", [d for d in DOCS if d.name != "algorithm.md"], ids=lambda p: p.name)
def test_every_repository_path_exists(doc):
    """Workflow, config, SLURM, test and doc paths too (algorithm.md also names the reference's
    own files, `config/nft.py` and the like, so it is left out)."""
    missing = []
    for match in REPO_PATH.finditer(doc_text(doc)):
        rel = match.group(1).rstrip(".,:;)")
        if not (list(ROOT.glob(rel)) if "*" in rel else (ROOT / rel).exists()):
            missing.append(rel)
    assert not missing, f"{doc.name} names paths that do not exist: {sorted(set(missing))}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_dotted_marble_name_exists(doc):
    bad = {}
    for match in DOTTED.finditer(doc_text(doc)):
        problem = dotted_problem(match.group(0))
        if problem:
            bad[match.group(0)] = problem
    assert not bad, f"{doc.name}: {bad}"


def test_every_python_m_module_runs():
    found = all_docs_findings(PYTHON_M)
    assert found, "the docs name no `python -m marble...`: the pattern is broken"
    bad = sorted({f"{doc}: {mod}" for doc, mod in found if not runs_under_m(mod)})
    assert not bad, f"`python -m` of a module that does not run: {bad}"


def commands_in_docs() -> dict[tuple[str, ...], set[str]]:
    """(command, subcommand or '') -> flags named with it anywhere in the docs' code."""
    out: dict[tuple[str, ...], set[str]] = {}
    for doc in DOCS:
        for fragment in code_fragments(doc_text(doc)):
            for match in COMMAND.finditer(fragment):
                cmd, tail = match.group(1), match.group(2).split()
                sub = tail[0] if tail and re.fullmatch(r"[a-z][\w-]*", tail[0]) else ""
                flags = {re.split(r"[=\[\]]", t)[0] for t in tail if t.startswith("--")}
                out.setdefault((doc.name, cmd, sub), set()).update(flags)
    return out


@functools.lru_cache(maxsize=None)
def help_text(*argv: str) -> str:
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), pytest.raises(SystemExit):
        marble_main([*argv, "--help"])
    return buf.getvalue()


def subcommands(cmd: str) -> set[str] | None:
    """A command's subcommand choices from its usage line, None when it has none."""
    usage = help_text(cmd).split("\n\n")[0]
    match = re.search(r"\{([\w,-]+)\}", usage)
    return set(match.group(1).split(",")) if match else None


def test_every_marble_command_flag_and_subcommand_exists():
    found = commands_in_docs()
    assert any(cmd == "train" for _, cmd, _ in found), "no `marble train` found: the pattern is broken"
    bad = []
    for (doc, cmd, sub), flags in sorted(found.items()):
        if cmd not in COMMANDS:
            bad.append(f"{doc}: `marble {cmd}` is no command ({sorted(COMMANDS)})")
            continue
        choices = subcommands(cmd)
        if choices is not None and sub and sub not in choices:
            bad.append(f"{doc}: `marble {cmd} {sub}`: not one of {sorted(choices)}")
            continue
        text = help_text(cmd, sub) if choices is not None and sub in choices else help_text(cmd)
        bad += [f"{doc}: `marble {cmd} {sub}`: no flag {flag}" for flag in sorted(flags)
                if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text)]
    assert not bad, "\n".join(bad)


def layout_rows(text: str) -> list[tuple[list[str], list[str]]]:
    """ARCHITECTURE.md's tables: (paths of the first cell, code spans of the last cell) per row."""
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) >= 3:
            paths = [m.group(0) for m in PATH.finditer(cells[0])]
            if paths:
                rows.append((paths, CODE_SPAN.findall(cells[-1])))
    return rows


def names_under(rel: str) -> set[str]:
    """Module-level names of a module path, or of every module of a package folder."""
    target = ROOT / rel.rstrip("/")
    files = sorted(target.rglob("*.py")) if target.is_dir() else [target] if target.is_file() else []
    return set().union(*(module_names(f) for f in files)) if files else set()


def test_architecture_names_only_existing_functions_and_constants():
    """The public-API column of each layout row names things its module(s) define."""
    rows = layout_rows(doc_text(ROOT / "docs" / "ARCHITECTURE.md"))
    assert len(rows) > 10, "the layout table was not found"
    bad = []
    for paths, spans in rows:
        defined = set().union(*(names_under(p) for p in paths))
        for span in spans:
            name = re.match(r"([A-Za-z_]\w*)", span)
            if not name or span.startswith(("marble ", "python ", "torchrun ", "make ", "--")):
                continue
            if name.group(1) not in defined:
                bad.append(f"{paths}: `{span}` ({name.group(1)} is not defined there)")
    assert not bad, "\n".join(bad)


def test_readme_lists_exactly_the_result_neutral_keys():
    """The keys docs/training.md says may change on resume are the ones `check_run_dir` lets change."""
    from marble.training.run_dir import RESULT_NEUTRAL_KEYS

    text = " ".join(doc_text(ROOT / "docs" / "training.md").split())
    match = re.search(r"may change on resume:([^.]*(?:\.[\w]+[^.]*)*?)\.(?:\s|$)", text)
    assert match, "docs/training.md: no list after 'may change on resume:'"
    listed = {span for span in CODE_SPAN.findall(match.group(1)) if not span.startswith("marble.")}
    assert listed == RESULT_NEUTRAL_KEYS, (f"docs/training.md lists {sorted(listed - RESULT_NEUTRAL_KEYS)} too many, "
                                           f"misses {sorted(RESULT_NEUTRAL_KEYS - listed)}")


def test_architecture_names_every_module():
    """Every module under marble/ has its row (or its folder's) in ARCHITECTURE.md."""
    text = doc_text(ROOT / "docs" / "ARCHITECTURE.md")
    named = {m.group(0).rstrip(".,:;)") for m in PATH.finditer(text)}
    missing = []
    for path in sorted((ROOT / "marble").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if path.name in ("__init__.py", "__main__.py"):
            continue  # a package is named by its folder, its `python -m` by the CLI's row
        if rel not in named:
            missing.append(rel)
    assert not missing, f"docs/ARCHITECTURE.md has no row for: {missing}"


def test_the_checks_catch_a_false_name(tmp_path):
    """The checkers themselves: a renamed constant, a missing module, an unknown command."""
    assert dotted_problem("marble.training.stopping.EXIT_REQUEUE") is None
    assert dotted_problem("marble.training.stopping.EXIT_REQUEUED") is not None
    assert dotted_problem("marble.nowhere.thing") is not None
    assert dotted_problem("marble.nowhere") == "marble defines no 'nowhere'"
    assert runs_under_m("marble.data") and not runs_under_m("marble.maths")
    fragments = code_fragments("run `marble train --preset tiny` then\n```\nmarble data assemble --raw-dir x\n```\n")
    assert [m.group(1) for f in fragments for m in COMMAND.finditer(f)] == ["data", "train"]


@functools.lru_cache(maxsize=None)
def defined_names(path: Path) -> frozenset[str]:
    """Module-level names a module defines itself (defs, classes, assignments; not imports)."""
    imported = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            imported.update((a.asname or a.name).split(".")[0] for a in node.names)
    return module_names(path) - imported


def test_architecture_points_at_definitions_not_re_exports():
    """A layout row's API and a "where to find it" name lead to the module that defines the
    name, not to one that only imports it (three rows once sent readers to re-exports)."""
    text = doc_text(ROOT / "docs" / "ARCHITECTURE.md")
    bad = []
    for paths, spans in layout_rows(text):
        files = [f for p in paths for f in ([ROOT / p] if (ROOT / p).is_file() else [])]
        if len(files) != len(paths):
            continue  # a folder row: its names live in several modules
        defined = set().union(*(defined_names(f) for f in files))
        for span in spans:
            name = re.match(r"([A-Za-z_]\w*)", span)
            if name and not span.startswith(("marble ", "python ", "torchrun ", "make ", "--")) \
                    and name.group(1) not in defined:
                bad.append(f"{paths}: `{name.group(1)}` is only imported there")
    where = text[text.index("## Where to find it"):text.index("## Layout")]
    for dotted in sorted(set(DOTTED.findall(where))):
        parts = dotted.split(".")
        for cut in range(len(parts), 0, -1):
            path = module_file(".".join(parts[:cut]))
            if path:
                break
        if cut < len(parts) and parts[cut] not in defined_names(path):
            bad.append(f"where to find it: {dotted} is only imported in {path.relative_to(ROOT)}")
    assert not bad, "\n".join(bad)


def test_no_doc_copies_an_overlay_config_for_dvc():
    """An overlay (`overlay_on:`) copied to config.yaml leaves DVC's `params: config.yaml: eval`
    blind to its base (config/eval.yaml): the docs compose it (marble.workflow.configs) instead."""
    import yaml

    overlays = [p.name for p in sorted((ROOT / "config").glob("*.yaml"))
                if "overlay_on" in (yaml.safe_load(p.read_text(encoding="utf-8")) or {})]
    assert "paper.yaml" in overlays
    copied = [(doc.name, name) for doc in [*DOCS, ROOT / "dvc.yaml"] for name in overlays
              if re.search(rf"cp\s+config/{re.escape(name)}\s+\S*config\.yaml", doc.read_text(encoding="utf-8"))]
    assert not copied, copied


APPTAINER_ARGS_SPACED = re.compile(r"--(?:apptainer|singularity)-args\s+\S")


def test_apptainer_args_take_their_value_with_an_equals_sign():
    """Snakemake 9 parses `--apptainer-args "--nv"` as a second option and stops (`expected one
    argument`): every doc and script gives `--apptainer-args="..."`."""
    files = [*DOCS, ROOT / "slurm/README.md", *sorted((ROOT / "container").glob("*.sh")), ROOT / "Makefile"]
    spaced = [(path.name, m.group(0)) for path in files if path.is_file()
              for m in APPTAINER_ARGS_SPACED.finditer(path.read_text(encoding="utf-8"))]
    assert not spaced, spaced
    assert not APPTAINER_ARGS_SPACED.search('--sdm apptainer --apptainer-args="--nv"')
    assert APPTAINER_ARGS_SPACED.search('--sdm apptainer --apptainer-args "--nv"')
CITED_DOC = re.compile(r"(?<![\w/.-])docs/[\w./-]+\.md")


def test_every_doc_the_code_cites_exists():
    """A `docs/*.md` named in marble/, tests/ or workflow/ (a message users see, a why-comment)
    is a file of this project; ../shared/docs is not the project's."""
    missing = []
    for folder in ("marble", "tests", "workflow"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix not in (".py", ".smk", ".sh", ".yaml", ".rst") and path.name != "Snakefile":
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                missing += [f"{path.relative_to(ROOT)}:{number}: {m.group()}" for m in CITED_DOC.finditer(line)
                            if not (ROOT / m.group()).is_file()]
    assert not missing, "\n".join(missing)


@pytest.mark.parametrize("title, register, test", [
    ("Add a reward", "marble.rewards.register", "tests/test_add_a_reward.py"),
    ("Add a balancer", "marble.balancers.register", "tests/test_add_a_balancer.py"),
])
def test_architecture_says_how_to_add_a_reward_and_a_balancer(title, register, test):
    """Each section names the registration its test adds a toy one through, and that test."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    match = re.search(rf"^## {title}\n(.*?)(?=^## )", text, re.S | re.M)
    assert match, f"docs/ARCHITECTURE.md has no '## {title}' section"
    section = match.group(1)
    assert register in section and test in section, (title, section)
    source = (ROOT / test).read_text(encoding="utf-8")
    assert f"{register.split('.')[1]}.register(" in source  # the test goes through it
