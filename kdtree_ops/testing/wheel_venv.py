"""A fresh virtual environment with a binary wheel installed offline, seeing this Python's packages (torch, numpy,
ninja: nothing is downloaded) — also where this Python is itself a virtual environment, whose packages
`venv --system-site-packages` alone would not show (it shows the base interpreter's).

    python -m kdtree_ops.testing.wheel_venv ROOT WHEEL [--no-deps]
"""

from __future__ import annotations

import argparse
import site
import subprocess
import sys
import sysconfig
from pathlib import Path


def make_wheel_venv(root: Path, wheel: Path, deps: bool = True) -> Path:
    """Creates the venv at `root`, lends it this interpreter's site-packages by a .pth file (after the venv's own, so
    the wheel's copy of kdtree_ops wins over any other installed one) and installs `wheel` with pip, offline.
    deps=False installs without resolving requirements (a machine whose torch lacks a dependency's wheel). Returns
    the venv's python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(root)], check=True)
    python = root / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    lent = [p for p in [*site.getsitepackages(), sysconfig.get_paths()["purelib"]] if Path(p).is_dir()]
    (Path(purelib) / "_lent_site_packages.pth").write_text("".join(f"{p}\n" for p in dict.fromkeys(lent)))
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-index", "-q",
                    *([] if deps else ["--no-deps"]), str(wheel)], check=True)
    return python


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", type=Path)
    parser.add_argument("wheel", type=Path)
    parser.add_argument("--no-deps", action="store_true")
    args = parser.parse_args()
    print(make_wheel_venv(args.root, args.wheel, deps=not args.no_deps))


if __name__ == "__main__":
    main()
