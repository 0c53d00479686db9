"""The runs' persistent compilation cache: where it goes, what turns it off, and a folder that
cannot be made leaves it off with a warning instead of stopping the run."""

import jax
import pytest

from crl_jax.run import compile_cache


@pytest.fixture
def jax_cache_config(monkeypatch):
    """Restore JAX's cache settings after the test; no JAX_COMPILATION_CACHE_DIR of the caller's."""
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    saved = (jax.config.jax_compilation_cache_dir, jax.config.jax_compilation_cache_max_size)
    yield
    jax.config.update("jax_compilation_cache_dir", saved[0])
    jax.config.update("jax_compilation_cache_max_size", saved[1])


def test_a_folder_is_made_and_bounded(jax_cache_config, tmp_path):
    folder = tmp_path / "a" / "cache"
    assert compile_cache.enable(str(folder)) == str(folder)
    assert folder.is_dir()
    assert jax.config.jax_compilation_cache_dir == str(folder)
    assert jax.config.jax_compilation_cache_max_size == compile_cache.MAX_BYTES


def test_empty_turns_it_off_and_the_environment_takes_precedence(jax_cache_config, tmp_path, monkeypatch):
    before = jax.config.jax_compilation_cache_dir
    assert compile_cache.enable("") is None
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "shared"))
    assert compile_cache.enable(str(tmp_path / "mine")) == str(tmp_path / "shared")
    assert not (tmp_path / "mine").exists() and jax.config.jax_compilation_cache_dir == before


def test_a_folder_that_cannot_be_made_leaves_the_cache_off(jax_cache_config, tmp_path, caplog):
    (tmp_path / "file").write_text("not a folder")
    before = jax.config.jax_compilation_cache_dir
    assert compile_cache.enable(str(tmp_path / "file" / "cache")) is None
    assert "compilation cache off: cannot create" in caplog.text
    assert jax.config.jax_compilation_cache_dir == before


def test_the_default_folder_follows_xdg_cache_home(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert compile_cache.default_dir() == str(tmp_path / "crl_jax" / "jax_cache")
