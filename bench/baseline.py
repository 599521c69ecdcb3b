"""The code of an earlier commit, for a benchmark that measures it side by side with this tree.

    with installed("9256cb1") as site:          # a folder to put first on PYTHONPATH
        subprocess.run([...], env={**os.environ, "PYTHONPATH": str(site)})

The commit is checked out as a detached git worktree and installed without dependencies (this
venv's are used) into a scratch folder; both are removed on leaving the block. A process started
with that folder first on its PYTHONPATH imports the commit's `optimizer_pipeline` (its assets and
resources included) instead of the editable install of this tree.
"""

import shutil
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[1]


@contextmanager
def installed(ref: str) -> Iterator[Path]:
    scratch = Path(tempfile.mkdtemp(prefix="bench-baseline-"))
    tree, site = scratch / "tree", scratch / "site"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), ref], check=True,
                   capture_output=True)
    try:
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site),
                        str(tree)], check=True, capture_output=True)
        yield site
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], capture_output=True)
        shutil.rmtree(scratch, ignore_errors=True)
