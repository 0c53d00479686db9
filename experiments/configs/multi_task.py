"""Multi-task Complementary RL: the paper's 3-task and 6-task mixtures, with the offline analogues
(household for ALFWorld, shop for WebShop) where the paper used data that cannot be downloaded.

    python experiments/run.py --config=multi_task.py            # 3 tasks (Room, shop, household)
    python experiments/run.py --config=multi_task.py:six        # 6 tasks (+ Maze, KeyRoom, Sokoban)
    python experiments/run.py --config=multi_task.py:six,baseline

Every single-task variant (baseline, static, exp_only, no_merge, ...) applies here too.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import single_task  # noqa: E402

THREE = ("minihack/room-ultimate-5x5", "shop/v1", "household/v1")
SIX = THREE[:1] + ("minihack/mazewalk-9x9", "minihack/keyroom-dark-s5", "sokoban/6x6-2box") + THREE[1:]


def get_config(arg: str | None = None):
    c = single_task.base_config()
    c.tasks = THREE
    c.rollout.groups_per_step = 6
    for variant in filter(None, (arg or "").split(",")):
        variant = variant.strip()
        if variant == "three":
            c.tasks = THREE
        elif variant == "six":
            c.tasks = SIX
            c.rollout.groups_per_step = 6
        else:
            single_task.apply_variant(c, variant)
    return c
