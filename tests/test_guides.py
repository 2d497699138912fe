"""The guides work as written: their shell commands run, the plans they show are the plans printed,
and every setting they name exists.

Which guides: README.md and every docs/*.md (a new guide is picked up by being there). Which
commands: the lines of each fenced block tagged `bash`, `sh`, `shell` or `console`, or untagged,
that start with a program of COMMAND_STARTS (`uv`, `hf`, `python`, ...), or the `$ ` lines of a
console block (a trailing backslash continues a line; `#` starts a comment; lines after a line
`...` are the command's output as the guide shows it).

A block is not run when the guide says why in an HTML comment on the line before its fence:

    <!-- not run by tests/test_guides.py: needs an NVIDIA GPU -->

and a block the test runs shorter than written says how, the same way; the words are appended to
each of its commands (after the rule below, so they win):

    <!-- tests/test_guides.py adds: --rounds 1 -->

As in a shell, a command ending in `&` runs in the background: the next command starts once it
has printed a URL (a server listening) or ended; `kill %N` sends the N-th one SIGTERM and passes
when it then exits with 0 or by that signal; `wait` waits for them all; one still running at the
guide's end fails it. A pipe's reader (`| head`) is left out: the test reads the whole output.
`cat > FILE <<'EOF'` writes the lines up to `EOF` to FILE.

Commands are run in order, per guide, in a clean copy of the repository (its tracked files, so
every file a guide uses is made by an earlier command of that guide or shipped), with this
environment's `trainer` and `python` for `uv run` (a guide's own venv would install for
minutes). Each is shortened by one rule, appended as overrides that win over the guide's own:

- `trainer train`: SHORT_TRAIN (two steps of 2 prompts x 2, a 4-problem held-out set) and, where the
  run warm-starts (a preset model, or a guide's own warm_start.steps), a two-step warm start; with
  `--resume`, only the length (a resumed run keeps its saved settings): 2 steps, or 4 where the
  guide extends the run;
- `trainer compare`: the same, and `--seeds 1`; `trainer bench`: `--steps 2`;
- other commands (plan, config, algos, tasks, eval, export, convert, python scripts) as written.

A block showing output under `...` is checked too: each shown line is in what the command
prints (whitespace aside), so the plans in scaling.md, real-models.md and lora.md stay true.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHELL_TAGS = {"", "bash", "sh", "shell", "console"}
COMMAND_STARTS = ("uv ", "hf ", "python ", "python3 ", "trainer ", "pip ", "git ", "kill %")
JOB_CONTROL = ("wait",)
"""Whole lines that are commands too (`wait` for the background jobs)."""
SKIP = re.compile(r"<!--\s*not run by tests/test_guides\.py:\s*(.+?)\s*-->")
ADDS = re.compile(r"<!--\s*tests/test_guides\.py adds:\s*(.+?)\s*-->")
HEREDOC = re.compile(r"^cat > (\S+) <<\s*'?(\w+)'?$")
"""`cat > FILE <<'EOF'` ... `EOF`: a file the guide writes."""
SHORT_TRAIN = ("training.num_steps=2", "training.prompts_per_step=2", "algorithm.group_size=2",
               "eval.every_steps=0", "eval.heldout_size=4", "eval.samples_per_prompt=1", "eval.pass_k=1")
SHORT_WARM_START = "warm_start.steps=2"
"""For a preset model (800 warm-start steps by default); a loaded model has none unless the guide says."""
SHORTER = {"train": SHORT_TRAIN, "compare": SHORT_TRAIN}
PLANS_CHECKED: dict[str, bool] = {}
"""Plan blocks with shown output that test_a_plan_a_guide_shows_is_the_plan_printed ran: where -> passed."""
COMMAND_SECONDS = 600


@dataclasses.dataclass
class Block:
    guide: Path
    line: int
    commands: list[str]
    shown: list[str]
    skip: str | None
    adds: tuple[str, ...] = ()
    """Words the test appends to each command (the guide's `tests/test_guides.py adds:` comment)."""

    @property
    def where(self) -> str:
        return f"{self.guide.relative_to(ROOT)}:{self.line}"


def guides() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks(guide: Path) -> list[Block]:
    """The guide's fenced shell blocks that hold at least one `uv` command."""
    lines = guide.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        fence = re.match(r"^\s*```\s*([\w-]*)", lines[i])
        if not fence:
            i += 1
            continue
        tag, start = fence.group(1).lower(), i
        body = []
        i += 1
        while i < len(lines) and not re.match(r"^\s*```", lines[i]):
            body.append(lines[i])
            i += 1
        i += 1
        if tag not in SHELL_TAGS:
            continue
        commands, shown, pending, output, heredoc = [], [], "", False, None
        console = any(line.strip().startswith("$ ") for line in body)  # `$ command` lines, the rest output
        for raw in body:
            text = raw.strip()
            if heredoc is not None:  # the file's lines as written, up to the delimiter
                if text == heredoc:
                    commands.append(pending + "\n")
                    pending, heredoc = "", None
                else:
                    pending += "\n" + raw
                continue
            if not console and not pending and (start_file := HEREDOC.match(text)):
                pending, heredoc = text, start_file.group(2)
                continue
            if console and not pending:
                if not text.startswith("$ "):
                    continue
                text = text[2:]
                pending = text
            elif output:
                shown.append(text)
                continue
            elif text == "...":
                output = True
                continue
            elif pending:
                pending += " " + text
            elif text.startswith(COMMAND_STARTS) or text.split("#")[0].strip() in JOB_CONTROL:
                pending = text
            else:
                continue
            if pending.endswith("\\"):
                pending = pending[:-1].rstrip()
                continue
            commands.append(pending)
            pending = ""
        if not commands:
            continue
        before = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        skip, adds = SKIP.search(before), ADDS.search(before)
        out.append(Block(guide, start + 1, commands, [s for s in shown if s], skip.group(1) if skip else None,
                         tuple(shlex.split(adds.group(1))) if adds else ()))
    return out


def argv(command: str) -> list[str]:
    """The command's words without its comment and a pipe's reader, `uv run` replaced by this
    environment's program."""
    words = shlex.split(command, comments=True)
    if "|" in words:
        words = words[: words.index("|")]
    if words[:2] == ["uv", "run"]:
        words = words[2:]
    if words and words[0] in ("python", "python3"):
        words[0] = sys.executable
    elif words and (Path(sys.executable).parent / words[0]).exists():  # trainer, pytest, ...
        words[0] = str(Path(sys.executable).parent / words[0])
    return words


def shortened(words: list[str]) -> list[str]:
    """`words` with the rule for its command appended (the module's docstring)."""
    if len(words) < 2 or Path(words[0]).name != "trainer":
        return words
    command = words[1]
    if "--resume" in words:  # a resumed run keeps its saved settings: only its length may change
        extends = any(w.startswith("training.num_steps=") for w in words)
        return [w for w in words if not w.startswith("training.num_steps=")] + [
            f"training.num_steps={4 if extends else 2}"]
    extra = list(SHORTER.get(command, ()))
    if command in SHORTER and ("--model" not in words or any(w.startswith("warm_start.steps=") for w in words)):
        extra.append(SHORT_WARM_START)
    if command == "compare" and "--seeds" not in words:
        extra += ["--seeds", "1"]
    if command == "bench" and "--steps" not in words:
        extra += ["--steps", "2"]
    return words + extra


def clean_copy(dest: Path) -> Path:
    """The repository's tracked files (and untracked ones git does not ignore) copied into `dest`."""
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        src = ROOT / name
        if src.is_file():
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
    return dest


def normalized(text: str) -> str:
    return " ".join(text.split())


# -- the plans the guides show -------------------------------------------------------------------


def plan_blocks() -> list[Block]:
    return [b for g in guides() for b in blocks(g)
            if b.shown and b.skip is None and argv(b.commands[0])[1:2] == ["plan"]]


@pytest.mark.e2e
@pytest.mark.parametrize("block", plan_blocks(), ids=lambda b: b.where)
def test_a_plan_a_guide_shows_is_the_plan_printed(block, trainer_xla_flags):
    """Each line a guide shows under a `trainer plan` command is in what that command prints now."""
    (command,) = block.commands
    env = {**os.environ, "XLA_FLAGS": trainer_xla_flags}  # as a user's trainer compiles, not the suite's flags
    out = subprocess.run(argv(command), cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    printed = {normalized(line) for line in out.stdout.splitlines()}
    missing = [line for line in block.shown if normalized(line) not in printed]
    PLANS_CHECKED[block.where] = not missing
    assert not missing, f"{block.where}: the plan now prints\n{out.stdout}\nnot {missing}"


def test_the_guides_show_the_plans_of_the_issue():
    """The DAPO 1.5B plan (scaling.md, real-models.md) and the LoRA 7B plan (lora.md) are checked."""
    shown = {b.guide.name for b in plan_blocks()}
    assert {"scaling.md", "real-models.md", "lora.md"} <= shown


# -- every guide's commands, run as written ------------------------------------------------------


@pytest.fixture(scope="module")
def tally(request):
    """Counts over the guides, printed at the end of the module: commands run, passed, not run."""
    counts = {"run": 0, "passed": 0, "not run": 0}
    yield counts
    if counts["run"] + counts["not run"]:
        shown(request, f"guides: {counts['run']} commands run, {counts['passed']} passed, "
                       f"{counts['not run']} not run (each with its guide's reason)")


def shown(request, *lines: str) -> None:
    """Print past pytest's capture, so that a passing run lists what it did too."""
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled():
        for line in lines:
            print(line, flush=True)


def environment(copy: Path) -> dict[str, str]:
    """This environment's programs first on PATH; the copy as the working directory's project."""
    bin_dir = str(Path(sys.executable).parent)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONDONTWRITEBYTECODE": "1"}


class Jobs:
    """A guide's background commands (`... &`), in the order they started: `kill %N`, `wait`, its end."""

    def __init__(self) -> None:
        self.started: list[tuple[subprocess.Popen, list[str]]] = []

    def start(self, words: list[str], cwd: Path, env: dict[str, str]) -> tuple[bool, str]:
        """Start it; True once it printed a URL (a server listening) or ended with 0."""
        process = subprocess.Popen(words, cwd=cwd, env={**env, "PYTHONUNBUFFERED": "1"},  # its URL line at once
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lines: list[str] = []
        ready = threading.Event()

        def read() -> None:
            with process.stdout:
                for line in process.stdout:
                    lines.append(line)
                    if "http://" in line:
                        ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        self.started.append((process, lines))
        if not ready.wait(COMMAND_SECONDS):
            return False, f"printed no URL within {COMMAND_SECONDS} s"
        if any("http://" in line for line in lines):
            return True, ""
        return process.wait(timeout=COMMAND_SECONDS) == 0, "".join(lines)[-1500:]

    def kill(self, number: int) -> tuple[bool, str]:
        """`kill %number`: SIGTERM; passes when it then exits with 0 or by the signal, as `kill` does."""
        if not 1 <= number <= len(self.started):
            return False, f"no background job %{number} ({len(self.started)} started)"
        process, lines = self.started[number - 1]
        process.send_signal(signal.SIGTERM)
        return self._ended(process, lines, -signal.SIGTERM)

    def wait(self) -> tuple[bool, str]:
        results = [self._ended(process, lines) for process, lines in self.started]
        return all(ok for ok, _ in results), "\n".join(why for ok, why in results if not ok)

    def left_running(self) -> list[str]:
        """The commands still running at the guide's end (killed now)."""
        running = [" ".join(process.args) for process, _ in self.started if process.poll() is None]
        for process, _ in self.started:
            if process.poll() is None:
                process.kill()
            process.wait()
        return running

    @staticmethod
    def _ended(process: subprocess.Popen, lines: list[str], also: int = 0) -> tuple[bool, str]:
        try:
            code = process.wait(timeout=COMMAND_SECONDS)
        except subprocess.TimeoutExpired:
            return False, f"still running {COMMAND_SECONDS} s later"
        return code in (0, also), f"exit status {code}: {''.join(lines)[-1500:]}"


def write_file(command: str, copy: Path) -> tuple[bool, str]:
    """A `cat > FILE <<'EOF'` command: FILE written in the copy."""
    first, _, text = command.partition("\n")
    target = copy / HEREDOC.match(first).group(1)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    return True, ""


def run_command(words: list[str], copy: Path, env: dict[str, str], jobs: Jobs) -> tuple[bool, str]:
    """(passed, why not): one command as a shell would run it (the module's docstring)."""
    if words[-1:] == ["&"]:
        return jobs.start(words[:-1], copy, env)
    if words[:1] == ["kill"] and len(words) == 2 and words[1].startswith("%") and words[1][1:].isdigit():
        return jobs.kill(int(words[1][1:]))
    if words == ["wait"]:
        return jobs.wait()
    try:
        out = subprocess.run(words, cwd=copy, env=env, capture_output=True, text=True, timeout=COMMAND_SECONDS)
    except subprocess.TimeoutExpired:
        return False, f"still running after {COMMAND_SECONDS} s"
    return out.returncode == 0, (out.stderr or out.stdout)[-1500:]


@pytest.mark.e2e
@pytest.mark.parametrize("guide", guides(), ids=lambda g: g.relative_to(ROOT).as_posix())
def test_a_guides_commands_run_as_written(guide, tmp_path, tally, request):
    copy = clean_copy(tmp_path / "repo")
    env = environment(copy)
    lines, failures, jobs = [], [], Jobs()
    try:
        for block in blocks(guide):
            for command in block.commands:
                if block.skip:
                    tally["not run"] += 1
                    lines.append(f"not run  {block.where}: {command[:80]}  ({block.skip})")
                    continue
                if block.where in PLANS_CHECKED:  # run above, its shown lines compared
                    tally["run"] += 1
                    tally["passed"] += PLANS_CHECKED[block.where]
                    lines.append(f"{'passed' if PLANS_CHECKED[block.where] else 'FAILED'}   {block.where}: "
                                 f"{command[:80]} (test_a_plan_a_guide_shows_is_the_plan_printed)")
                    if not PLANS_CHECKED[block.where]:
                        failures.append(f"{block.where}: the plan it shows is not the plan printed")
                    continue
                if HEREDOC.match(command.partition("\n")[0]):
                    tally["run"] += 1
                    tally["passed"] += 1
                    lines.append(f"passed   {block.where}: {command.partition(chr(10))[0]} (a file written)")
                    write_file(command, copy)
                    continue
                words = argv(command)
                background = words[-1:] == ["&"]
                words = shortened(words[:-1] if background else words)
                if block.adds and Path(words[0]).name in ("trainer", Path(sys.executable).name):
                    words += block.adds
                start = time.perf_counter()
                ok, why = run_command(words + ["&"] * background, copy, env, jobs)
                tally["run"] += 1
                tally["passed"] += ok
                lines.append(f"{'passed' if ok else 'FAILED'}   {block.where}: {command[:80]} "
                             f"({time.perf_counter() - start:.0f} s)")
                if not ok:
                    failures.append(f"{block.where}: {shlex.join(words)}\n{why}")
    finally:
        failures += [f"{guide.name}: still running at the guide's end: {c}" for c in jobs.left_running()]
    shown(request, "", *lines)
    assert not failures, "\n\n".join(failures)


def test_every_block_not_run_says_why():
    """A skip comment with no reason is no reason."""
    for guide in guides():
        for block in blocks(guide):
            assert block.skip is None or len(block.skip) > 10, block.where


# -- every setting a guide names exists ----------------------------------------------------------

SECTIONS = ("algo", "variant", "task", "model", "warm_start", "training", "rollout", "algorithm", "eval", "reward_audit",
            "judge", "rewards")
SETTING = re.compile(rf"(?<![\w./-])((?:{'|'.join(SECTIONS)})(?:\.[a-z_][a-z0-9_]*)+)")
FILE_ENDINGS = (".md", ".py", ".yaml", ".yml", ".json", ".jsonl", ".txt", ".png", ".parquet", ".safetensors", ".gguf")


def named_settings(guide: Path) -> set[str]:
    """Dotted setting names in the guide's inline code and shell commands (`training.share_prompts`,
    `algorithm.rollout_correction.mode=off`), file names aside."""
    text = guide.read_text()
    spans = re.findall(r"`([^`\n]+)`", text)
    spans += [c for b in blocks(guide) for c in b.commands]
    names = set()
    for span in spans:
        for match in SETTING.finditer(span):
            name = match.group(1)
            if span[match.end(1):match.end(1) + 1] == ".":  # a weight key's pattern (model.layers.<i>.mlp), no setting
                continue
            if not name.endswith(FILE_ENDINGS) and "." in name:
                names.add(name)
    return names


def setting_exists(name: str) -> bool:
    """Whether `name` is a field path of RunSettings (algorithm.* of any installed algorithm's config);
    below a free-form mapping (task.options, rewards, rollout.environment_options) any key is allowed."""
    import typing

    from rl_core import registry
    from rl_core.config import Config
    from trainer.settings import RunSettings

    def walk(cls: type, parts: list[str]) -> bool:
        fields = {f.name for f in dataclasses.fields(cls)}
        if not parts:
            return True
        if parts[0] not in fields:
            return False
        if cls is RunSettings and parts[0] == "algorithm":
            return len(parts) == 1 or any(walk(registry.get_algorithm(a).config, parts[1:])
                                          for a in registry.registry.names("algorithm"))
        hint = typing.get_type_hints(cls)[parts[0]]
        members = typing.get_args(hint) or (hint,)
        rest = parts[1:]
        if not rest:
            return True
        configs = [m for m in members if isinstance(m, type) and issubclass(m, Config)]
        if configs:
            return any(walk(c, rest) for c in configs)
        return any(m is dict or typing.get_origin(m) is dict for m in members)  # a free-form mapping

    return walk(RunSettings, name.split("."))


def test_every_setting_a_guide_names_exists():
    unknown = {g.relative_to(ROOT).as_posix(): sorted(n for n in named_settings(g) if not setting_exists(n))
               for g in guides()}
    assert not {g: names for g, names in unknown.items() if names}


def test_the_setting_check_tells_a_setting_from_a_typo():
    assert setting_exists("training.share_prompts") and setting_exists("algorithm.rollout_correction.mode")
    assert setting_exists("task.options.heldout_data") and setting_exists("model.lora.rank")
    assert not setting_exists("training.share_prompt") and not setting_exists("algorithm.rollout_correction.mod")
    assert named_settings(ROOT / "docs" / "scaling.md") >= {"training.share_prompts", "training.mesh.fsdp"}
    mixture = named_settings(ROOT / "docs" / "mixture-of-experts.md")
    assert "model.layers" not in mixture and not any(n.startswith("model.layers.") for n in mixture)


def test_the_block_reader_knows_jobs_files_pipes_and_shortenings(tmp_path):
    guide = tmp_path / "guide.md"
    guide.write_text("\n".join([
        "<!-- tests/test_guides.py adds: --rounds 1 -->", "```bash",
        "uv run python tests/support/reward_server.py --port 8765 &   # a server",
        "cat > ones.yaml <<'EOF'", "rewards:", "  ones: {function: remote_score}", "EOF",
        "uv run trainer samples runs/g --json | head   # the first lines", "kill %1", "wait", "```",
    ]))  # fmt: skip
    (block,) = blocks(guide)
    assert block.adds == ("--rounds", "1") and block.skip is None
    server, write, samples, kill, wait = block.commands
    assert argv(server)[1:] == ["tests/support/reward_server.py", "--port", "8765", "&"]
    assert write == "cat > ones.yaml <<'EOF'\nrewards:\n  ones: {function: remote_score}\n"  # indentation kept
    assert argv(samples)[1:] == ["samples", "runs/g", "--json"]  # the pipe's reader left out
    assert (argv(kill), argv(wait)) == (["kill", "%1"], ["wait"])
    write_file(write, tmp_path)
    assert (tmp_path / "ones.yaml").read_text() == "rewards:\n  ones: {function: remote_score}\n"
