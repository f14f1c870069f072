"""The code stays lint-clean (ruff, with the project's settings in pyproject.toml)."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_clean():
    # the environment's own ruff first: `make test` runs .venv/bin/python without activating the environment
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (pip install -e .[dev])")
    proc = subprocess.run([ruff, "check", "nvfp4lib", "tests"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:]
