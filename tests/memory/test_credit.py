"""Credit assignment to the extractor (rollout/credit.py): an episode's outcome reaches exactly the
extractor generations whose output the actor saw, and nothing else. Three ways the actor sees one:
an entry retrieved into its system prompt (credited to the generation that wrote it), a
search-and-ask reply (credited to the refinement generation), and an entry a merge rewrote
(credited to the merge generation, not to the distillations it replaced: the paper's released
code keys the reward on the generation whose output was used, merges included)."""

import numpy as np

from crl_jax.memory.manager import MemoryConfig, MemoryManager
from crl_jax.memory.text_store import Generation
from crl_jax.rollout.credit import ExtractorCredit
from crl_jax.rollout.experience import ExperienceService
from crl_jax.rollout.reward_buffer import generation_key
from crl_jax.rollout.trajectory import EpisodeSpec, Trajectory
from tests.memory.test_experience_merge import ScriptedExtractor


def _add(title):
    return f"<answer>add(<title>{title}</title><content>lesson {title}</content>)</answer>"


def test_each_outcome_reaches_only_the_generation_whose_output_the_episode_used(bank_fns, hash_embed):
    manager = MemoryManager(MemoryConfig(tasks=("room", "maze"), capacity=32, dim=16, merge_every=5,
                                         merge_chunk=2), bank_fns, hash_embed)
    wrote = {name: Generation([i], [i, 50 + i], kind="distill") for i, name in enumerate("abcd")}
    ids = {}
    for name, task in zip("abcd", ("room", "room", "maze", "maze")):
        _, (ids[name],) = manager.distill(task, f"query {name}", _add(name), [], 1, wrote[name])
    assert manager.writes["added"] == 4 and manager.writes["updated"] == manager.writes["evicted"] == 0
    extractor = ScriptedExtractor([
        "<<<RETURN>>>",                                                           # room: a, b kept
        "<<<KNOWLEDGE_ITEM>>>\n<title>cd</title>\n<content>c and d</content>\n<<<END_ITEM>>>",  # maze
        "ask the room about b",                                                   # a refinement
    ])
    service = ExperienceService(manager, extractor, seed=0)
    assert service.merge(params=None, step=5)["written"] == 1
    merge_gen = extractor.made[1]
    merged = next(e for e in manager.store if e.task == "maze")
    assert merged.generation == merge_gen and not {ids["c"], ids["d"]} & {e.entry_id for e in manager.store}

    entries = service.retrieve(["query a", "query a", "query c"], ["room", "room", "maze"], step=6)
    assert [e.entry_id for e in entries] == [ids["a"], ids["a"], merged.entry_id]
    (answer, refine_gen), = service.refiner(params=None, step=6)([("room", "query b")])
    assert answer == "ask the room about b" and refine_gen.kind == "refine"

    episodes = [Trajectory(EpisodeSpec(task, seed, group, True))
                for task, seed, group in (("room", 1, 0), ("room", 1, 0), ("maze", 2, 1))]
    for traj, success in zip(episodes, (True, False, False)):
        traj.success = success
    episodes[1].refinements.append(refine_gen)       # the failing room episode also asked
    credit = ExtractorCredit(batch_size=3, cache_length=64, cooldown_steps=1, weight_power=0.5, pad_id=0)
    credit.credit(episodes, entries)

    rewards = {generation_key(s.generation): (s.reward, s.uses, s.entry_ids)
               for s in credit.buffer._samples.values()}
    assert rewards == {
        generation_key(wrote["a"]): (0.0, 2, {ids["a"]}),          # +1 and -1, averaged
        generation_key(refine_gen): (-1.0, 1, set()),
        generation_key(merge_gen): (-1.0, 1, {merged.entry_id}),
    }
    for unused in ("b", "c", "d"):   # shown to the refiner, or merged away: never credited
        assert generation_key(wrote[unused]) not in rewards

    # The batch: the three samples, Eq. 7 weights (first training: weight 1), and the entries
    # marked trained when the next step joins.
    metrics = {}
    batch = credit.batch(manager, step=6, metrics=metrics)
    assert batch is not None and metrics["extractor/samples"] == 3.0
    np.testing.assert_allclose(metrics["extractor/reward"], np.mean([0.0, -1.0, -1.0]))
    assert credit.pending_trained == sorted([ids["a"], merged.entry_id])
    credit.apply_marks(manager)
    assert credit.pending_trained == [] and len(credit.buffer) == 0
