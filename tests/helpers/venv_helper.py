"""Virtual environments for the packaging tests (standard library only, so that a child interpreter without
longsparse can import it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def checked(cmd, **kw) -> subprocess.CompletedProcess:
    """subprocess.run that fails the test with the child's stderr (and stdout) when the child fails."""
    res = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    assert res.returncode == 0, (
        f"{' '.join(map(str, cmd))} exited {res.returncode}:\n{res.stderr[-3000:]}\n{res.stdout[-1000:]}"
    )
    return res


def venv_reusing_these_packages(venv: Path) -> Path:
    """A fresh venv at ``venv`` that sees the packages of the running interpreter (torch, pip, ...) after its own
    site-packages; returns its python. ``venv --system-site-packages`` would not do: run from inside a venv it
    reuses the *base* interpreter's packages, not this venv's, so torch would be missing there. The running
    interpreter's site folders are added as plain paths (their .pth files, e.g. an editable longsparse, are not
    run), so what gets installed into the new venv is what it imports."""
    checked([sys.executable, "-m", "venv", "--without-pip", venv], timeout=120)
    py = Path(venv) / "bin" / "python"
    own = checked([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    outer = [p for p in sys.path if p.endswith(("site-packages", "dist-packages")) and Path(p).is_dir()]
    (Path(own) / "_outer_packages.pth").write_text("\n".join(outer) + "\n")
    return py
