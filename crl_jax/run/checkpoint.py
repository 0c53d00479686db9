"""Run checkpoints: one Orbax step holds the whole state of a run, and restore finds a valid one.

A step holds two items: `device`, a pytree of (possibly sharded) jax arrays saved collectively by
Orbax (both TrainStates, the bank arrays, ...), and `host`, a JSON document written by process 0
(text store, extractor reward buffer, loop counters, task-stream position, numpy RNG state, and the
config digest). Saves are asynchronous: `save` returns once arrays are copied off the device, the
files are written in a background thread, and the next `save`, `wait` or `close` waits for them.

Validity. Orbax writes a step into a temporary directory and renames it only once every item is
committed, so a crash mid-save leaves no step that is listed. Just before that rename, process 0
writes a manifest (size and sha256 of every payload file) into the step, so a listed step always
carries its manifest. Restore checks the manifest first: a truncated, missing or altered file
(which Orbax itself may restore silently as wrong values) marks the step corrupt; the step is
reported, moved aside into `corrupt_steps/`, and the next older step is tried. A step without a
manifest (saved by another writer) is tried unverified; a restore error, or content the caller's
`accept` refuses, then also falls back."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
import warnings
from typing import Any, Callable

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

log = logging.getLogger(__name__)

DEVICE_ITEM, HOST_ITEM = "device", "host"
MANIFEST = "crl_manifest.json"
CORRUPT_DIR = "corrupt_steps"
_TMP_SUFFIX = ".orbax-checkpoint-tmp"  # Orbax's name for a step that is not finalised yet
# Orbax's note "Checkpoint commit was successful to <absolute path>", in each step and item. It is
# bookkeeping that Orbax does not read back on a local filesystem (a step's rename into place is
# its commit there), and it names the machine's folder: the manifest leaves it out and
# `portable_copy` drops it.
COMMIT_NOTE = "commit_success.txt"
_FORMAT = 1


class CheckpointError(RuntimeError):
    """No checkpoint can be restored (none saved, all corrupt, or one that does not fit)."""


class SaveFailed(RuntimeError):
    """A checkpoint could not be written (a full disk, a file-size limit, an unwritable folder);
    the message names the step, the cause and the newest complete step a rerun resumes from."""


class ConfigMismatchError(CheckpointError):
    """The checkpoint was saved under a different configuration."""


class CorruptCheckpointWarning(UserWarning):
    """A checkpoint step failed verification and was skipped."""


def config_digest(config: Any, ignore: tuple[str, ...] = ()) -> str:
    """A short sha256 digest of a configuration (a dict, or anything with `to_dict()`), computed
    over its canonical JSON. `ignore` lists dotted keys left out, e.g. settings a resumed run may
    legitimately change ("train.num_steps", "logging.every")."""
    tree = config.to_dict() if hasattr(config, "to_dict") else config
    tree = json.loads(json.dumps(tree, sort_keys=True, default=repr))
    for dotted in ignore:
        *parents, last = dotted.split(".")
        node = tree
        for key in parents:
            node = node.get(key, {}) if isinstance(node, dict) else {}
        if isinstance(node, dict):
            node.pop(last, None)
    canonical = json.dumps(tree, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _json_problems(obj: Any, where: str = "host_state") -> list[str]:
    """Everything in `obj` that would not come back from JSON exactly as it went in."""
    if obj is None or isinstance(obj, (bool, str, int, float)):
        return []  # json writes repr(float), which reads back bit-identical (NaN/inf included)
    if isinstance(obj, dict):
        out = [f"{where}: key {k!r} is not a str" for k in obj if not isinstance(k, str)]
        for k, v in obj.items():
            out += _json_problems(v, f"{where}[{k!r}]")
        return out
    if isinstance(obj, list):
        return [p for i, v in enumerate(obj) for p in _json_problems(v, f"{where}[{i}]")]
    hint = " (it would come back as a list)" if isinstance(obj, tuple) else ""
    if isinstance(obj, (np.generic, np.ndarray)):
        hint = " (convert with .tolist() or int()/float())"
    return [f"{where}: {type(obj).__name__} is not plain JSON{hint}"]


def _file_digest(path: epath.Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _payload_files(step_dir: epath.Path) -> list[epath.Path]:
    """The item files of a step. Orbax's own step-level bookkeeping is left out: it may be
    rewritten after the manifest, and Orbax validates it itself."""
    def walk(d: epath.Path):  # (epath refuses recursive globs, which are slow on object stores)
        for p in d.iterdir():
            yield from walk(p) if p.is_dir() else (p,)

    return sorted(p for item in (DEVICE_ITEM, HOST_ITEM) for p in walk(step_dir / item)
                  if p.name != COMMIT_NOTE)


def _write_manifest(step_dir: epath.Path, with_checksums: bool) -> None:
    entries = {}
    for p in _payload_files(step_dir):
        rel = str(p.relative_to(step_dir))
        entries[rel] = {"size": p.stat().length}
        if with_checksums:
            entries[rel]["sha256"] = _file_digest(p)
    (step_dir / MANIFEST).write_text(json.dumps({"format": _FORMAT, "files": entries}, indent=0))


def portable_copy(source: str, target: str) -> None:
    """Copy a checkpoint folder (or one step of it) to `target` without Orbax's commit notes
    (COMMIT_NOTE), which name the absolute path it was first written to; the copy restores as the
    original does. For checkpoints kept with a project's records, on a local filesystem."""
    shutil.copytree(source, target, ignore=shutil.ignore_patterns(COMMIT_NOTE))


def _manifest_problem(step_dir: epath.Path) -> str | None:
    """None when every file the manifest lists is present, of the right size and checksum."""
    try:
        manifest = json.loads((step_dir / MANIFEST).read_text())
        entries = manifest["files"]
    except Exception as e:  # unreadable, truncated or malformed manifest
        return f"its manifest {MANIFEST} is unreadable ({type(e).__name__}: {e})"
    for rel, want in sorted(entries.items()):
        if os.path.basename(rel) == COMMIT_NOTE:  # listed by manifests written before it was left out
            continue
        p = step_dir / rel
        if not p.exists():
            return f"file {rel} is missing"
        size = p.stat().length
        if size != want["size"]:
            return f"file {rel} has {size} bytes, expected {want['size']} (truncated or rewritten)"
        if "sha256" in want and _file_digest(p) != want["sha256"]:
            return f"file {rel} fails its sha256 checksum (contents altered)"
    return None


def _abstract_target(target: Any) -> Any:
    """ShapeDtypeStructs with shardings for every leaf: live arrays give their own sharding."""
    missing = []

    def to_abstract(path, x):
        if isinstance(x, jax.Array):
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
        if isinstance(x, jax.ShapeDtypeStruct) and x.sharding is not None:
            return x
        missing.append(jax.tree_util.keystr(path))
        return x

    abstract = jax.tree_util.tree_map_with_path(to_abstract, target)
    if missing:
        raise ValueError(
            "restore target leaves need a sharding (pass live arrays, or ShapeDtypeStructs built "
            f"with sharding=...); without one: {', '.join(missing[:5])}"
            + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))
    return abstract


def _brief(e: BaseException) -> str:
    """One line for an error: its innermost cause (Orbax wraps TensorStore's precise message in
    a generic one that prints a whole store spec)."""
    while (e.__cause__ or e.__context__) is not None:
        e = e.__cause__ or e.__context__
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return f"{type(e).__name__}: {' | '.join(lines)[:600]}"


def _agree(flag: bool) -> bool:
    """Process 0's verdict, shared with every process so all of them restore the same step."""
    if jax.process_count() == 1:
        return flag
    from jax.experimental import multihost_utils
    return bool(multihost_utils.broadcast_one_to_all(np.int32(flag)))


def _accepted(accept, device_tree, host_state):
    """(device_tree, host_state) if every process accepts them, else (None, reason)."""
    problem = None
    try:
        accept(device_tree, host_state)
    except (KeyError, TypeError, ValueError) as err:
        problem = f"its content is not a state this run writes ({type(err).__name__}: {err})"
    if not _agree(problem is None):
        return None, problem or "another process refused its content"
    return device_tree, host_state


class Checkpointer:
    """Keep-last-N asynchronous checkpoints of (device pytree, host JSON) in `directory`.

    `digest` (see `config_digest`) is stored with every step; `restore` refuses a step whose
    digest differs unless `ignore_digest=True`. `checksums=False` keeps only file sizes in the
    manifest, for checkpoints too large to hash at every save (truncation is still caught).

    A resume's target needs shapes, dtypes and shardings, not values: live states, or
    `jax.eval_shape(build_states)` mapped to ShapeDtypeStructs with their shardings.
    """

    def __init__(self, directory, max_to_keep: int = 3, async_save: bool = True,
                 digest: str | None = None, checksums: bool = True):
        if max_to_keep < 1:
            raise ValueError(f"max_to_keep must be >= 1, got {max_to_keep}")
        self.directory = epath.Path(directory).absolute()
        self.digest = digest
        self.async_save = async_save
        self.checksums = checksums
        self.skipped: dict[int, str] = {}  # step -> why, for the steps the last restore skipped
        self._saving_step: int | None = None
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep, create=True, cleanup_tmp_directories=True,
            enable_async_checkpointing=True,  # the manifest hook needs the async path; see save()
            async_options=ocp.AsyncOptions(post_finalization_callback=self._on_finalize))
        self._mgr = ocp.CheckpointManager(self.directory, options=options,
                                          item_names=(DEVICE_ITEM, HOST_ITEM))

    # ---- saving -------------------------------------------------------------------------

    def _on_finalize(self) -> None:
        """Runs in Orbax's finalize thread after all items are committed and before the step
        directory is renamed into place, so the manifest is part of the atomic step."""
        step = self._saving_step
        if jax.process_index() != 0 or step is None:
            return
        pending = sorted(self.directory.glob(f"{step}{_TMP_SUFFIX}*"))
        step_dir = pending[-1] if pending else self.directory / str(step)  # (in-place writers)
        _write_manifest(step_dir, self.checksums)

    def save(self, step: int, device_tree: Any, host_state: dict) -> None:
        """Start saving `step`. Returns once device arrays are copied to host memory; the caller
        may then donate or overwrite them. `host_state` is copied now, so later mutation of it
        does not leak into the checkpoint."""
        problems = _json_problems(host_state)
        if problems:
            raise TypeError("host_state must be plain JSON (dict/list/str/int/float/bool/None):\n  "
                            + "\n  ".join(problems[:10]))
        host_doc = {"format": _FORMAT, "config_digest": self.digest,
                    "host_state": json.loads(json.dumps(host_state))}
        self._finish_pending()  # the manifest hook reads _saving_step: one save at a time
        latest = self._mgr.latest_step()
        if latest is not None and step <= latest:
            raise ValueError(f"cannot save step {step}: {self.directory} already holds step "
                             f"{latest}; steps must increase")
        self._saving_step = int(step)
        self._mgr.save(int(step), force=True, args=ocp.args.Composite(**{
            DEVICE_ITEM: ocp.args.StandardSave(device_tree),
            HOST_ITEM: ocp.args.JsonSave(host_doc)}))
        if not self.async_save:
            self.wait()

    def wait(self) -> None:
        """Block until the last save is committed (raises SaveFailed if it failed)."""
        self._finish_pending()

    def _finish_pending(self) -> None:
        try:
            self._mgr.wait_until_finished()
            self._mgr.check_for_errors()
        except Exception as err:  # Orbax and tensorstore raise ValueError, OSError, RuntimeError
            cause = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
            complete = [s for s in self.all_steps() if s != self._saving_step]
            resume = (f"step {complete[-1]} is the newest complete checkpoint, where a rerun resumes"
                      if complete else "no complete checkpoint is left: a rerun starts over")
            raise SaveFailed(f"saving the checkpoint of step {self._saving_step} in "
                             f"{self.directory} failed ({cause}); is the disk full? {resume}") from None

    def close(self) -> None:
        # Orbax cleans temporary folders on a thread of its own and its close() does not wait for
        # it: a folder deleted right after close raced that thread (a logged FileNotFoundError).
        getattr(self._mgr, "_maybe_await_cleanup_tmp_directory", lambda: None)()
        self._mgr.close()

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- listing and restoring ----------------------------------------------------------

    def all_steps(self) -> list[int]:
        """Committed steps, oldest first (not yet verified)."""
        self._mgr.reload()
        return sorted(self._mgr.all_steps())

    def latest_step(self) -> int | None:
        steps = self.all_steps()
        return steps[-1] if steps else None

    def restore(self, target: Any, step: int | None = None, ignore_digest: bool = False,
                accept: Callable[[Any, dict], None] | None = None):
        """Restore `(step, device_tree, host_state)` from the newest valid step (or exactly
        `step`). `target` is a pytree shaped like the saved device tree: live arrays, or
        ShapeDtypeStructs with shardings (`jax.eval_shape` + shardings); restored arrays get
        those shardings, whatever mesh they were saved from. `accept(device_tree, host_state)`
        adopts a step's content, raising ValueError, KeyError or TypeError where the run could
        not have written it: that step is unusable too."""
        self.wait()
        abstract = _abstract_target(target)
        steps = self.all_steps()
        if not steps:
            raise CheckpointError(f"no checkpoint to restore in {self.directory}")
        if step is not None:
            if step not in steps:
                raise CheckpointError(f"no step {step} in {self.directory}; have {steps}")
            steps = [step]
        self.skipped = {}
        for s in reversed(steps):
            problem = self._verify(s)
            if problem is None:
                device_tree, host_state = self._restore_step(s, abstract, ignore_digest)
                if device_tree is not None and accept is not None:
                    device_tree, host_state = _accepted(accept, device_tree, host_state)
                if device_tree is not None:
                    self._quarantine(sorted(self.skipped))
                    return s, device_tree, host_state
                problem = host_state  # _restore_step returned (None, reason)
            self.skipped[s] = problem
            msg = f"checkpoint step {s} in {self.directory} is unusable: {problem}"
            if step is None:
                msg += "; trying the previous step"
            log.warning(msg)
            warnings.warn(msg, CorruptCheckpointWarning, stacklevel=2)
            if step is not None:
                break
        detail = "; ".join(f"step {s}: {why}" for s, why in sorted(self.skipped.items()))
        raise CheckpointError(f"no valid checkpoint in {self.directory} ({detail}); to start "
                              "over, move the folder aside (the unusable steps stay in it)")

    def _verify(self, step: int) -> str | None:
        step_dir = self.directory / str(step)
        problem = None
        if jax.process_index() == 0 and (step_dir / MANIFEST).exists():
            problem = _manifest_problem(step_dir)
        if not _agree(problem is None):
            return problem or "process 0 found it corrupt"
        return None

    def _restore_step(self, step: int, abstract: Any, ignore_digest: bool):
        """(device_tree, host_state), or (None, reason) when the files cannot be read. A step
        whose manifest verified but does not fit `abstract` is a caller error and raises."""
        verified = (self.directory / str(step) / MANIFEST).exists()
        try:
            host_doc = self._mgr.restore(step, args=ocp.args.Composite(
                **{HOST_ITEM: ocp.args.JsonRestore()}))[HOST_ITEM]
        except Exception as e:
            return None, f"host state unreadable ({_brief(e)})"
        saved = host_doc.get("config_digest")
        if not ignore_digest and None not in (self.digest, saved) and saved != self.digest:
            raise ConfigMismatchError(
                f"checkpoint step {step} in {self.directory} was saved with config digest {saved}, "
                f"the current config has {self.digest}; resume with the original config, choose "
                "another workdir, or pass ignore_digest=True to restore anyway")
        try:
            device_tree = self._mgr.restore(step, args=ocp.args.Composite(
                **{DEVICE_ITEM: ocp.args.StandardRestore(abstract)}))[DEVICE_ITEM]
        except Exception as e:
            reason = _brief(e)
            if verified:
                raise CheckpointError(
                    f"checkpoint step {step} in {self.directory} is intact but does not fit the "
                    f"restore target (different model or bank shape?): {reason}") from e
            return None, f"device arrays unreadable ({reason})"
        return device_tree, host_doc["host_state"]

    def _quarantine(self, steps: list[int]) -> None:
        """Move unusable steps aside (kept for inspection) so their step numbers can be saved
        again by the resumed run."""
        if not steps:
            return
        if jax.process_index() == 0:
            aside = self.directory / CORRUPT_DIR
            aside.mkdir(parents=True, exist_ok=True)
            for s in steps:
                dest = aside / f"{s}-{int(time.time())}"
                (self.directory / str(s)).rename(dest)
                log.warning("moved unusable checkpoint step %d to %s", s, dest)
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils
            multihost_utils.sync_global_devices("crl_jax.run.checkpoint.quarantine")
        self._mgr.reload()

