"""The docs check: every command README.md and docs/*.md show is one the project has, and every
link between them (and from bench/README.md) lands on a file and a heading that exist.

Commands are read from fenced code blocks (```bash, ```sh, ```shell, ```console, and untagged or
```text blocks for the lines that start with a known program) and checked without running anything:

- `investigations ...` is parsed by the CLI's own parser (`investigations.cli.build_parser`);
- `make TARGET` names a target of the Makefile (and `VAR=... make TARGET` passes VAR's flags to the
  bench the target runs: those are checked as that bench's flags);
- `python -m bench.MOD ...` names a file under bench/, and its flags parse with the bench's own
  parser when one can be built without running the bench, else each `--flag` is one the module
  declares with `add_argument`;
- `dagster`, `dagster-daemon`, `dagster-webserver` are parsed by Dagster's own click commands;
- any other program fails the check unless it is listed in UNCHECKED with the reason it cannot be
  checked offline.

Placeholders are filled in before parsing: `<name>` becomes `x` (a number for a port), and an
optional part written `[--flag VALUE]` or `[VALUE]` is kept without its brackets.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import io
import re
import shlex
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

COMMAND_LANGS = {"bash", "sh", "shell", "console"}  # every line is a command (console: `$ ` lines only)
LOOSE_LANGS = {"", "text"}  # only the lines that start with a known program are commands

# Programs whose commands cannot be checked offline, and why. A program that is neither checked
# below nor listed here fails the check: someone decides how to check it first.
UNCHECKED = {
    "curl": "talks to a running sandbox or intake (`make run`); nothing to parse offline",
}

DAGSTER_PROGRAMS = {"dagster", "dagster-daemon", "dagster-webserver"}
KNOWN_PROGRAMS = {"investigations", "make", "python", *DAGSTER_PROGRAMS, *UNCHECKED}
PORT_PLACEHOLDER = "8000"


# -- reading the docs ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the block's first content line
    lang: str
    lines: tuple[str, ...]


@dataclass(frozen=True)
class DocCommand:
    path: Path
    line: int
    text: str  # as the doc shows it (continuations joined)
    program: str = ""
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = field(default=())

    @property
    def where(self) -> str:
        return f"{_rel(self.path)}:{self.line}"

    def __str__(self) -> str:
        """Where it is and the command as shown, without its comment."""
        try:
            shown = " ".join(shlex.split(self.text, comments=True))
        except ValueError:
            shown = self.text
        return f"{self.where}: {shown}"


def _rel(path: Path) -> str:
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})\s*(?P<lang>[\w+-]*)")


def fenced_blocks(text: str, path: Path) -> list[Block]:
    blocks: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        opened = FENCE.match(lines[i])
        if not opened:
            i += 1
            continue
        fence, lang = opened["fence"], opened["lang"].lower()
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not re.match(rf"^ {{0,3}}{fence[0]}{{{len(fence)},}}\s*$", lines[j]):
            body.append(lines[j])
            j += 1
        blocks.append(Block(path, i + 2, lang, tuple(body)))
        i = j + 1
    return blocks


def _logical_lines(block: Block) -> list[tuple[int, str]]:
    """(line number, text) per command line: `$ ` stripped, `\\` continuations joined; comments,
    blank lines and (in console blocks) output lines left out."""
    found: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for offset, raw in enumerate(block.lines):
        number = block.line + offset
        line = raw.rstrip()
        if pending is not None:
            start, text = pending
            text = f"{text} {line.strip()}"
        else:
            stripped = line.strip()
            prompted = stripped.startswith("$ ")
            if prompted:
                stripped = stripped[2:].strip()
            if not stripped or stripped.startswith("#"):
                continue
            if block.lang == "console" and not prompted:
                continue  # output
            if block.lang in LOOSE_LANGS and not prompted and _program_of(stripped) not in KNOWN_PROGRAMS:
                continue  # a path, a listing, an example: not a command
            start, text = number, stripped
        if text.endswith("\\"):
            pending = (start, text[:-1].rstrip())
        else:
            pending = None
            found.append((start, text))
    if pending is not None:
        found.append(pending)
    return found


def _program_of(line: str) -> str:
    words = line.split()
    while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
        words.pop(0)
    return _normalise_program(words[0]) if words else ""


def _normalise_program(word: str) -> str:
    name = word.rsplit("/", 1)[-1] if word.startswith((".venv/", "./.venv/", "$VIRTUAL_ENV/")) else word
    return "python" if re.fullmatch(r"python(3(\.\d+)?)?", name) else name


PLACEHOLDER = re.compile(r"<([^<>\n]+)>")
OPTIONAL = re.compile(r"\[(-[^\[\]]*|[A-Z][A-Z0-9_]*)\]")


def fill_placeholders(text: str) -> str:
    text = PLACEHOLDER.sub(lambda m: PORT_PLACEHOLDER if "port" in m[1].lower() else "x", text)
    return OPTIONAL.sub(r"\1", text)


def command_of(path: Path, line: int, text: str) -> DocCommand:
    words = shlex.split(fill_placeholders(text), comments=True)
    env: list[tuple[str, str]] = []
    while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
        name, _, value = words.pop(0).partition("=")
        env.append((name, value))
    program = _normalise_program(words[0]) if words else ""
    return DocCommand(path, line, text, program, tuple(words[1:]), tuple(env))


def commands_in(text: str, path: Path) -> list[DocCommand]:
    commands = []
    for block in fenced_blocks(text, path):
        if block.lang in COMMAND_LANGS or block.lang in LOOSE_LANGS:
            commands += [command_of(path, number, line) for number, line in _logical_lines(block)]
    return commands


def doc_commands() -> list[DocCommand]:
    return [c for path in DOC_FILES for c in commands_in(path.read_text(encoding="utf-8"), path)]


ALL_COMMANDS = doc_commands()


def _of(*programs: str) -> list[DocCommand]:
    return [c for c in ALL_COMMANDS if c.program in programs]


def _ids(commands: Sequence[DocCommand]) -> list[str]:
    return [str(c) for c in commands]


# -- checking a command --------------------------------------------------------------------------


def _argparse_problem(parse: Callable[[list[str]], object], args: Sequence[str]) -> str | None:
    """None if `parse(args)` accepts them; argparse's own message if it exits."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parse(list(args))
    except SystemExit as exc:
        message = err.getvalue().strip().splitlines()
        return message[-1] if message else f"the parser exited ({exc.code})"
    return None


def investigations_problem(command: DocCommand) -> str | None:
    from investigations.cli import build_parser

    return _argparse_problem(build_parser().parse_args, command.args)


@cache
def makefile_targets() -> dict[str, list[str]]:
    """Each target of the Makefile and its recipe lines."""
    targets: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in (ROOT / "Makefile").read_text().splitlines():
        rule = re.match(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", line)
        if rule and not rule[1].startswith("."):
            current = targets.setdefault(rule[1], [])
        elif line.startswith("\t") and current is not None:
            current.append(line.strip())
        elif line.strip() and not line.startswith("#"):
            current = None
    return targets


def make_problem(command: DocCommand) -> str | None:
    words = [a for a in command.args if not a.startswith("-") and "=" not in a]
    if not words:
        return "no target named (the Makefile's default target is not what a doc means to show)"
    targets = makefile_targets()
    missing = [w for w in words if w not in targets]
    if missing:
        return f"no Makefile target {', '.join(missing)} (targets: {', '.join(sorted(targets))})"
    for name, value in command.env:  # VAR=... make target: VAR's flags go to the bench the target runs
        for recipe in (line for w in words for line in targets[w]):
            bench = re.search(r"-m\s+(bench[\w.]*)\s.*\$[({]" + re.escape(name) + r"[)}]", recipe)
            if bench:
                problem = bench_problem(bench[1], shlex.split(value))
                if problem:
                    return f"{name}: {problem}"
    return None


def _python_module(command: DocCommand) -> tuple[str, list[str]] | None:
    args = list(command.args)
    if len(args) >= 2 and args[0] == "-m":
        return args[1], args[2:]
    return None


def _ast_of(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _declared_options(path: Path) -> set[str]:
    """Every option string an `add_argument(...)` call in the file declares."""
    options = set()
    for node in ast.walk(_ast_of(path)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            options |= {a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)}
    return {o for o in options if o.startswith("-")}


def _imports_common_parse_args(tree: ast.Module) -> bool:
    return any(isinstance(n, ast.ImportFrom) and n.module == "bench.common"
               and any(a.name == "parse_args" for a in n.names) for n in tree.body)


def bench_parser(module: str, path: Path) -> Callable[[list[str]], object] | None:
    """The bench's own parser, when it can be called without running the bench:
    a module-level `parse_args(argv)`, or `bench.common.parse_args` with a module-level `extra`."""
    tree = _ast_of(path)
    top = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    own = top.get("parse_args")
    if own is not None and len(own.args.args) == 1 and not own.args.kwonlyargs:
        return lambda argv: importlib.import_module(module).parse_args(argv)
    if not _imports_common_parse_args(tree) or "main" not in top:
        return None
    for node in ast.walk(top["main"]):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "parse_args":
            extra = next((k.value for k in node.keywords if k.arg == "extra"), None)
            if extra is not None and not (isinstance(extra, ast.Name) and extra.id in top):
                return None  # an `extra` built inside main(): only its declared flags can be checked
            from bench import common

            hook = extra.id if isinstance(extra, ast.Name) else None
            return lambda argv: common.parse_args(
                argv, description=module, default_duration_s=1.0,
                extra=getattr(importlib.import_module(module), hook) if hook else None)
    return None


def bench_problem(module: str, args: Sequence[str]) -> str | None:
    parts = module.split(".")
    if parts[0] != "bench":
        return f"{module} is not a bench module"
    path = ROOT.joinpath(*parts).with_suffix(".py") if len(parts) > 1 else ROOT / "bench" / "__main__.py"
    if not path.is_file():
        return f"{_rel(path)} does not exist"
    parse = bench_parser(module, path)
    if parse is not None:
        return _argparse_problem(parse, args)
    declared = _declared_options(path)
    if _imports_common_parse_args(_ast_of(path)):
        declared |= _declared_options(ROOT / "bench" / "common.py")
    unknown = [a.split("=", 1)[0] for a in args if a.startswith("--") and a.split("=", 1)[0] not in declared]
    if unknown:
        return f"{_rel(path)} declares no {', '.join(unknown)} (it declares {', '.join(sorted(declared))})"
    return None


def python_problem(command: DocCommand) -> str | None:
    target = _python_module(command)
    if target is None or target[0].split(".")[0] != "bench":
        return "only `python -m bench...` commands are checked; add a check for this one"
    return bench_problem(*target)


def _click_command(program: str):  # noqa: ANN202 - click is Dagster's dependency, imported lazily
    from importlib.metadata import entry_points

    import click

    entries = [e for e in entry_points(group="console_scripts") if e.name == program]
    assert entries, f"`{program}` is not installed in this environment"
    entry = entries[0]
    cli = getattr(importlib.import_module(entry.module), "cli", None)
    assert isinstance(cli, click.Command), f"{program}: no click command `cli` next to its entry point {entry.value}"
    return cli


def dagster_problem(command: DocCommand) -> str | None:
    import click

    def parse(cmd: click.Command, args: list[str], name: str, parent: click.Context | None = None) -> None:
        with cmd.make_context(name, args, parent=parent) as ctx:
            if isinstance(cmd, click.Group):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", DeprecationWarning)  # protected_args: Click < 9
                    rest = [*ctx.protected_args, *ctx.args]
                if rest:
                    sub_name, sub, sub_args = cmd.resolve_command(ctx, rest)
                    assert sub is not None and sub_name is not None
                    parse(sub, sub_args, sub_name, ctx)

    try:
        with contextlib.chdir(ROOT):  # paths (`-w deploy/workspace.yaml`) are the project's
            parse(_click_command(command.program), list(command.args), command.program)
    except click.ClickException as exc:
        return exc.format_message()
    modules = [command.args[i + 1] for i, a in enumerate(command.args[:-1]) if a in ("-m", "--module-name")]
    missing = [m for m in modules if not (ROOT / f"{m.replace('.', '/')}.py").is_file()
               and not (ROOT / m.replace(".", "/") / "__init__.py").is_file()]
    return f"no module {', '.join(missing)} in the project" if missing else None


def env_problem(command: DocCommand) -> str | None:
    """A setting that names a project file (`INVESTIGATIONS_SOURCES=sources.public.yaml`) names one that exists."""
    missing = [f"{n}={v}" for n, v in command.env
               if re.fullmatch(r"[\w./-]+\.(ya?ml|json|toml)", v) and not (ROOT / v).is_file()]
    return f"no such file: {', '.join(missing)}" if missing else None


CHECKS: dict[str, Callable[[DocCommand], str | None]] = {
    "investigations": investigations_problem,
    "make": make_problem,
    "python": python_problem,
    **dict.fromkeys(DAGSTER_PROGRAMS, dagster_problem),
}


def command_problem(command: DocCommand) -> str | None:
    if not command.program:
        return "no program"
    check = CHECKS.get(command.program)
    if check is None:
        if command.program in UNCHECKED:
            return None
        return (f"no check for `{command.program}` commands: add one to tests/test_docs.py, or list the "
                "program in UNCHECKED with the reason it cannot be checked")
    return env_problem(command) or check(command)


def _assert_checks(command: DocCommand) -> None:
    problem = command_problem(command)
    if problem:
        pytest.fail(f"{command}\n  -> {problem}", pytrace=False)


# -- links and anchors ---------------------------------------------------------------------------


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation other than `-` and `_`
    removed, each space a hyphen (so an em dash between spaces leaves two hyphens)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links and images: their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _without_fences(text: str) -> str:
    """The text with its fenced blocks blanked, line numbers kept."""
    lines = text.splitlines()
    fence: str | None = None
    for i, line in enumerate(lines):
        opened = FENCE.match(line)
        if fence is None and opened:
            fence, lines[i] = opened["fence"], ""
        elif fence is not None:
            if re.match(rf"^ {{0,3}}{fence[0]}{{{len(fence)},}}\s*$", line):
                fence = None
            lines[i] = ""
    return "\n".join(lines)


def _without_code(text: str) -> str:
    """The text with fenced blocks blanked and inline code spans replaced, line numbers kept."""
    return re.sub(r"(`+)(?:(?!\1).)+?\1", "code", _without_fences(text))


def anchors_in(text: str) -> frozenset[str]:
    """The anchors of a Markdown text's headings (a repeated heading's get -1, -2, ...)."""
    anchors: list[str] = []
    seen: dict[str, int] = {}
    for heading in re.findall(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", _without_fences(text), re.M):
        slug = github_slug(heading)
        anchors.append(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return frozenset(anchors)


@cache
def anchors_of(path: Path) -> frozenset[str]:
    return anchors_in(path.read_text(encoding="utf-8"))


LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^()\s<>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)


@dataclass(frozen=True)
class DocLink:
    path: Path
    line: int
    target: str

    def __str__(self) -> str:
        return f"{_rel(self.path)}:{self.line}: {self.target}"


def links_in(text: str, path: Path) -> list[DocLink]:
    plain = _without_code(text)
    found = [*LINK.finditer(plain), *REFERENCE.finditer(plain)]
    links = [DocLink(path, plain.count("\n", 0, m.start()) + 1, m[1]) for m in found]
    return sorted((lk for lk in links if not re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", lk.target)),
                  key=lambda lk: lk.line)


def link_problem(link: DocLink, text: str | None = None) -> str | None:
    """None if the link lands; `text` is the linking doc's own text when it is not a file yet."""
    target, _, anchor = link.target.partition("#")
    if target:
        base = ROOT if target.startswith("/") else link.path.parent
        dest = (base / target.lstrip("/")).resolve()
        if not dest.exists():
            return f"{target} does not exist (from {_rel(link.path)})"
        if not anchor:
            return None
        if dest.suffix != ".md":
            return f"#{anchor}: {target} is not a Markdown file, it has no headings"
        anchors = anchors_of(dest)
    else:
        dest = link.path
        anchors = anchors_in(text) if text is not None else anchors_of(link.path)
    if anchor not in anchors:
        return f"no heading in {_rel(dest)} has the anchor #{anchor} (it has: {', '.join(sorted(anchors))})"
    return None


# bench/README.md links into docs/ too: its links are checked, its commands are the benches' own.
LINK_FILES = [*DOC_FILES, ROOT / "bench" / "README.md"]
ALL_LINKS = [lk for path in LINK_FILES for lk in links_in(path.read_text(encoding="utf-8"), path)]


# -- the tests -----------------------------------------------------------------------------------


def test_the_readme_opens_with_make_run_then_make_test() -> None:
    readme = ROOT / "README.md"
    first = fenced_blocks(readme.read_text(encoding="utf-8"), readme)[0]
    commands = [command_of(readme, n, line) for n, line in _logical_lines(first)]
    assert [(c.program, c.args) for c in commands] == [("make", ("run",)), ("make", ("test",))], (
        f"README.md:{first.line}: the first code block must be `make run` then `make test`, not "
        f"{[c.text for c in commands]}")


def test_the_docs_show_commands_of_every_checked_kind() -> None:
    """A reader that found nothing would pass every check below: the docs show each kind at least once."""
    assert {"investigations", "make", "python", "dagster"} <= {c.program for c in ALL_COMMANDS}, (
        sorted({c.program for c in ALL_COMMANDS}))
    assert {p.name for p in DOC_FILES} >= {"README.md", "guide.md", "configuration.md", "operations.md",
                                           "deploying.md", "design.md", "benchmarks.md"}


@pytest.mark.parametrize("command", _of("investigations"), ids=_ids(_of("investigations")))
def test_an_investigations_command_parses_with_the_cli_parser(command: DocCommand) -> None:
    _assert_checks(command)


@pytest.mark.parametrize("command", _of("make"), ids=_ids(_of("make")))
def test_a_make_command_names_a_makefile_target(command: DocCommand) -> None:
    _assert_checks(command)


@pytest.mark.parametrize("command", _of("python"), ids=_ids(_of("python")))
def test_a_bench_command_names_a_bench_module_and_its_flags(command: DocCommand) -> None:
    _assert_checks(command)


@pytest.mark.parametrize("command", _of(*DAGSTER_PROGRAMS), ids=_ids(_of(*DAGSTER_PROGRAMS)))
def test_a_dagster_command_parses_with_dagsters_cli(command: DocCommand) -> None:
    _assert_checks(command)


OTHER_COMMANDS = [c for c in ALL_COMMANDS if c.program not in CHECKS]
NONE_OTHER = pytest.param(None, marks=pytest.mark.skip(reason="the docs show no command of an unchecked kind"),
                          id="none")


@pytest.mark.parametrize("command", [*OTHER_COMMANDS] or [NONE_OTHER], ids=_ids(OTHER_COMMANDS) or None)
def test_any_other_command_is_listed_as_unchecked_with_a_reason(command: DocCommand) -> None:
    _assert_checks(command)
    pytest.skip(f"{command}: not checked: {UNCHECKED[command.program]}")


@pytest.mark.parametrize("link", ALL_LINKS, ids=[str(lk) for lk in ALL_LINKS])
def test_a_relative_link_lands_on_a_file_and_heading(link: DocLink) -> None:
    problem = link_problem(link)
    if problem:
        pytest.fail(f"{link}\n  -> {problem}", pytrace=False)


@pytest.mark.parametrize(("heading", "slug"), [
    ("Crash safety — what is promised", "crash-safety--what-is-promised"),
    ("`sources.yaml`", "sourcesyaml"),
    ("One lead's path", "one-leads-path"),
    ("Source assets are one-spec `multi_asset`s", "source-assets-are-one-spec-multi_assets"),
])
def test_anchors_follow_githubs_slug_rules(heading: str, slug: str) -> None:
    assert github_slug(heading) == slug


WRONG = [
    ("investigations nosuch", "invalid choice"),
    ("investigations dlq list --nosuch", "unrecognized arguments"),
    ("investigations records --limit 0", "must be above 0"),
    ("make nosuch", "no Makefile target"),
    ('FAULTS_ARGS="--nosuch 1" make faults', "FAULTS_ARGS"),
    ("python -m bench.nosuch", "does not exist"),
    ("python -m bench.case --nosuch", "unrecognized arguments"),
    ("python -m bench.faults --nosuch", "declares no --nosuch"),
    ("dagster-daemon run -w deploy/nosuch.yaml", "does not exist"),
    ("INVESTIGATIONS_SOURCES=nosuch.yaml make run", "no such file"),
    ("rm -rf .investigations", "no check for `rm` commands"),
]


@pytest.mark.parametrize(("line", "expected"), WRONG, ids=[line for line, _ in WRONG])
def test_a_wrong_command_in_a_doc_fails_the_check(line: str, expected: str) -> None:
    doc = ROOT / "docs" / "example.md"
    (command,) = commands_in(f"# Example\n\n```bash\n{line}   # a comment\n```\n", doc)
    assert command.line == 4
    problem = command_problem(command)
    assert problem is not None and expected in problem, problem


def test_a_command_listed_as_unchecked_passes_the_check_unparsed() -> None:
    (command,) = commands_in("```bash\ncurl -X POST localhost:8800/_control/quiet -d '{\"empty\": false}'\n```\n",
                             ROOT / "docs" / "example.md")
    assert command.program == "curl" and command_problem(command) is None


def test_a_broken_link_or_anchor_in_a_doc_fails_the_check() -> None:
    doc = ROOT / "docs" / "example.md"
    text = ("# Example\n\n[ok](#example) [gone](nosuch.md) [no heading](guide.md#nosuch) [page](#nosuch)\n"
            "`[in code](nosuch.md)`\n")
    problems = {lk.target: link_problem(lk, text) for lk in links_in(text, doc)}
    assert problems["#example"] is None
    assert set(problems) == {"#example", "nosuch.md", "guide.md#nosuch", "#nosuch"}
    assert all(problems[t] for t in ("nosuch.md", "guide.md#nosuch", "#nosuch")), problems


def test_console_blocks_keep_prompts_and_join_continuations() -> None:
    doc = ROOT / "docs" / "example.md"
    text = ("```console\n$ investigations fleet \\\n    --json\nsource  health\n$ make test\n```\n\n"
            "```\n<data dir>/evidence/<source>/\n```\n")
    commands = commands_in(text, doc)
    assert [(c.line, c.program, c.args) for c in commands] == [
        (2, "investigations", ("fleet", "--json")), (5, "make", ("test",))]


def test_placeholders_are_filled_in_before_parsing() -> None:
    command = command_of(ROOT / "README.md", 1, "investigations dlq requeue --source S [--lead ID] --priority <p>")
    assert command.args == ("dlq", "requeue", "--source", "S", "--lead", "ID", "--priority", "x")
    assert command_of(ROOT / "README.md", 1, "dagster code-server start -p <port>").args[-1] == PORT_PLACEHOLDER
