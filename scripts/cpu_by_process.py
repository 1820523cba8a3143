"""Where a command's CPU goes, by kind of process: runs COMMAND, reads /proc every 0.5 s for every
process on the machine that started after it, and prints each kind's CPU seconds (user + system) and
count. A process's last half second can be missed; what ran before COMMAND is not counted.

    python scripts/cpu_by_process.py -- bash scripts/test.sh
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")
KINDS = [  # (kind, pattern on the command line), first match wins
    ("chromium " + t, rf"chrom.*--type={t}\b") for t in ("renderer", "gpu-process", "zygote", "utility")
] + [("chromium browser", r"chrom"), ("pytest-xdist worker", r"exec\(eval"), ("app.py", r"app\.py"),
     ("gpu session", r"gpu_fullsize|gpu_session"), ("bench", r"dgemma\.bench"), ("pytest", r"pytest"),
     ("playwright driver", r"playwright/driver"), ("other python", r"python")]


def kind(command: str) -> str:
    return next((name for name, pattern in KINDS if re.search(pattern, command)), "other")


def main(argv: list[str]) -> int:
    if "--" not in argv:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    command = argv[argv.index("--") + 1:]
    before = {p for p in os.listdir("/proc") if p.isdigit()}
    seen: dict[str, tuple[str, float]] = {}
    child = subprocess.Popen(command)
    while child.poll() is None:
        for pid in set(os.listdir("/proc")) - before:
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
                fields = stat[stat.rfind(")") + 2:].split()
                cmd = seen[pid][0] if pid in seen else Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                seen[pid] = (cmd, (int(fields[11]) + int(fields[12])) / TICK)
            except (OSError, IndexError, ValueError):
                continue
        time.sleep(0.5)
    by_kind: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    for cmd, cpu in seen.values():
        by_kind[kind(cmd)][0] += cpu
        by_kind[kind(cmd)][1] += 1
    print(f"exit {child.returncode}; CPU by kind of process (s, count), {sum(v[0] for v in by_kind.values()):.1f} s in all:")
    for name, (cpu, count) in sorted(by_kind.items(), key=lambda kv: -kv[1][0]):
        print(f"{cpu:8.1f} {count:5d}  {name}")
    return child.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv))
