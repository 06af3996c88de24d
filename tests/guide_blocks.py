"""The code blocks of a Markdown page, as the docs' tests run them: a block with a `title` is
a file written under that name; an untitled `bash` or `python` block is run, in order, in the
same directory; a block right after a `<!-- not run ... -->` comment is only shown."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

FENCE = re.compile(r'^```(\w+)(?:\s+title="([^"]+)")?\s*$')
BIN = Path(sys.executable).parent


@dataclass
class Block:
    lang: str
    title: str | None
    code: str
    runs: bool
    line: int  # where it starts in the page, for messages


def blocks(text: str) -> list[Block]:
    """Every fenced block of `text`, in order."""
    out, lines, i, skip_next = [], text.splitlines(), 0, False
    while i < len(lines):
        line = lines[i]
        if line.strip().startswith("<!-- not run"):
            skip_next = True
        fence = FENCE.match(line)
        if fence:
            start, body = i + 1, []
            i += 1
            while i < len(lines) and lines[i].rstrip() != "```":
                body.append(lines[i])
                i += 1
            out.append(Block(fence.group(1), fence.group(2), "\n".join(body) + "\n", not skip_next, start))
            skip_next = False
        i += 1
    return out


def environment() -> dict[str, str]:
    """This environment for a subprocess: its venv's commands first on PATH, no usage stats,
    and no RAY_ADDRESS (a command starts its own Ray unless told otherwise)."""
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    env.pop("RAY_ADDRESS", None)
    return env


def run_page(page: Path, workdir: Path, timeout: float = 600) -> list[str]:
    """Write and run `page`'s blocks in `workdir`; the output of each run block. A block that
    fails raises AssertionError with its line in the page and its output."""
    outputs = []
    for block in blocks(page.read_text()):
        if block.title is not None:
            target = workdir / block.title
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(block.code)
            continue
        if not block.runs or block.lang not in ("bash", "python"):
            continue
        cmd = ["bash", "-e", "-c", block.code] if block.lang == "bash" else [sys.executable, "-c", block.code]
        done = subprocess.run(cmd, cwd=workdir, env=environment(), capture_output=True, text=True, timeout=timeout)
        text = done.stdout + done.stderr
        assert done.returncode == 0, f"{page.name}, block at line {block.line} failed:\n{block.code}\n{text[-4000:]}"
        outputs.append(text)
    return outputs
