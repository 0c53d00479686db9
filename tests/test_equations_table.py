"""docs/equations.md names a real function for every equation it maps."""

import importlib
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_function_in_the_equations_table_exists():
    with open(os.path.join(ROOT, "docs", "equations.md"), encoding="utf-8") as f:
        text = f.read()
    names = re.findall(r"`(crl_jax(?:\.\w+)+)`", text)
    assert len(names) >= 10
    for name in names:
        parts = name.split(".")
        for split in range(len(parts) - 1, 0, -1):  # the longest importable module prefix
            try:
                obj = importlib.import_module(".".join(parts[:split]))
            except ModuleNotFoundError:
                continue
            for attr in parts[split:]:
                obj = getattr(obj, attr)
            assert callable(obj) or isinstance(obj, property), name
            break
        else:
            raise AssertionError(f"{name}: no module of it imports")
    for equation in range(1, 9):
        assert f"| Eq.{equation} " in text or f"| Eq.{equation} +" in text or f"Eq.{equation}," in text
