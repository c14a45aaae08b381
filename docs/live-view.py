"""Make docs/live-view.png: a frame of ``loadprof diagnose --live`` as a terminal shows it.

Two ways, both from a real run:

    python docs/live-view.py run [--out docs/live-view.png] [-- SCRIPT ARGS...]
        runs ``loadprof diagnose --live`` (default: examples/torch_starved.py --epochs 3)
        in a tmux pane here, and takes the first frame with a verdict at --at seconds
        or later;

    python docs/live-view.py replay TYPESCRIPT [--at SECONDS] [--out docs/live-view.png]
        for a run recorded on another machine (one with a GPU) by
        ``script -q -c "stty cols 96 rows 20; loadprof diagnose --live ..." TYPESCRIPT``:
        plays the recording up to the end of the first frame with a verdict at --at
        seconds or later (default: the view's last frame) into a tmux pane of that size.
        docs/live-view.png is ``replay docs/live-view.typescript --at 20``, recorded on
        a machine with an H100.

Either way the pane is captured with its colours (``tmux capture-pane -e``), drawn by
rich as SVG (``Console.export_svg``) and photographed by headless Chromium. Needs
tmux and /usr/bin/chromium (Debian's ``chromium``).
"""

from __future__ import annotations

import argparse
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
SHOW_CURSOR = b"\x1b[?25h"  # rich's Live shows the cursor again as it stops, before erasing the view


class Tmux:
    def __init__(self, cols: int, rows: int) -> None:
        self.socket = f"loadprof-docs-{os.getpid()}"
        self.cols, self.rows = cols, rows

    def __call__(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, "-f", "/dev/null", *args], check=True,
                              capture_output=True, text=True, timeout=30).stdout

    def start(self, command: str) -> None:
        self("new-session", "-d", "-s", "v", "-x", str(self.cols), "-y", str(self.rows), "-c", str(ROOT), command)

    def screen(self, colours: bool = False) -> str:
        return self("capture-pane", "-p", *(["-e"] if colours else []), "-t", "v")

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=30)


def _frame_ready(screen: str, at: float) -> bool:
    seen = re.search(r"loadprof live: .*?(\d+) s\s*$", screen, re.M)
    verdict = re.search(r"^verdict\s+(\S+)", screen, re.M)
    return bool(seen and verdict and verdict.group(1) != "not" and int(seen.group(1)) >= at)


def capture_run(command: list[str], cols: int, rows: int, at: float, timeout: float) -> str:
    tmux = Tmux(cols, rows)
    line = " ".join(shlex.quote(a) for a in command)
    shown = "$ loadprof " + " ".join(shlex.quote(a) for a in command[command.index("diagnose"):])
    tmux.start(f"echo {shlex.quote(shown)}; {line}; sleep 600")
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if _frame_ready(tmux.screen(), at):
                return tmux.screen(colours=True)
            time.sleep(0.1)
        raise SystemExit(f"live-view.py: no frame with a verdict at {at:.0f} s or later in {timeout:.0f} s:\n"
                         + tmux.screen())
    finally:
        tmux.close()


def replay_end(data: bytes, at: float | None) -> int:
    """Where the recording's chosen frame ends: each frame is redrawn after a carriage
    return and an erase of its lines (rich's Live); the last is followed by the cursor
    shown again."""
    stop = data.rfind(SHOW_CURSOR)
    if stop < 0 or b"loadprof live:" not in data[:stop]:
        return -1
    if at is None:
        return stop
    for m in re.finditer(rb"loadprof live: [^\r\n]*?(\d+) s", data[:stop]):
        end = data.find(b"\r\x1b[2K", m.end())
        end = stop if end < 0 or end > stop else end
        frame = data[m.start():end]
        if int(m.group(1)) >= at and b"not yet" not in frame:
            return end
    return -1


def capture_replay(typescript: Path, cols: int, rows: int, at: float | None) -> str:
    data = typescript.read_bytes()
    end = replay_end(data, at)
    if end < 0:
        raise SystemExit(f"live-view.py: {typescript}: no frame of a live view with a verdict"
                         + (f" at {at:.0f} s or later" if at is not None else ""))
    with tempfile.TemporaryDirectory() as tmp:
        prefix = Path(tmp) / "prefix"
        # `script` writes a header line first; the pane shows what the terminal showed after it
        prefix.write_bytes(data[data.find(b"\n") + 1 if data.startswith(b"Script started") else 0:end])
        tmux = Tmux(cols, rows)
        tmux.start(f"stty -onlcr; cat {shlex.quote(str(prefix))}; sleep 600")
        try:
            deadline = time.monotonic() + 30
            while "loadprof live:" not in tmux.screen():
                if time.monotonic() > deadline:
                    raise SystemExit("live-view.py: the replay drew nothing in 30 s")
                time.sleep(0.1)
            time.sleep(0.5)
            return tmux.screen(colours=True)
        finally:
            tmux.close()


def to_png(ansi: str, out: Path, cols: int, title: str) -> None:
    from rich.console import Console
    from rich.text import Text

    text = Text.from_ansi(ansi.rstrip("\n") + "\n")
    console = Console(record=True, width=cols, file=io.StringIO(), force_terminal=True, color_system="truecolor")
    console.print(text, end="", soft_wrap=True)
    svg = console.export_svg(title=title)
    # Chromium draws the SVG at the window's size: make the window the SVG's own size
    size = re.search(r'viewBox="0 0 ([\d.]+) ([\d.]+)"', svg)
    if size is None:
        raise SystemExit("live-view.py: rich's SVG has no viewBox to size the screenshot by")
    width, height = float(size.group(1)), float(size.group(2))
    with tempfile.TemporaryDirectory() as tmp:
        page = Path(tmp) / "view.svg"
        page.write_text(svg, encoding="utf-8")
        shot = Path(tmp) / "view.png"
        subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        "--force-device-scale-factor=2", f"--window-size={int(width) + 1},{int(height) + 1}",
                        f"--screenshot={shot}", page.as_uri()], check=True, capture_output=True, timeout=120)
        out.write_bytes(shot.read_bytes())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "live-view.png")
    parser.add_argument("--cols", type=int, default=96)
    parser.add_argument("--rows", type=int, default=20)
    parser.add_argument("--title", default="loadprof diagnose --live examples/torch_starved.py")
    sub = parser.add_subparsers(dest="mode", required=True)
    run = sub.add_parser("run", help="run the example here, in tmux")
    run.add_argument("--at", type=float, default=10.0, help="seconds into the run of the frame taken")
    run.add_argument("--timeout", type=float, default=300.0)
    run.add_argument("script", nargs=argparse.REMAINDER,
                     help="script and arguments (default: examples/torch_starved.py --epochs 3)")
    replay = sub.add_parser("replay", help="replay a recording of a run made with `script`")
    replay.add_argument("typescript", type=Path)
    replay.add_argument("--at", type=float, default=None, help="seconds into the run of the frame taken")
    args = parser.parse_args()
    missing = [p for p in ("tmux", CHROMIUM) if shutil.which(p) is None]
    if missing:
        parser.error(f"needs {' and '.join(missing)}")
    if args.mode == "run":
        script = [a for a in args.script if a != "--"] or ["examples/torch_starved.py", "--epochs", "3"]
        loadprof = [sys.executable, "-m", "loadprof", "diagnose", "--live", *script]
        ansi = capture_run(loadprof, args.cols, args.rows, args.at, args.timeout)
    else:
        ansi = capture_replay(args.typescript, args.cols, args.rows, args.at)
    to_png(ansi, args.out, args.cols, args.title)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
