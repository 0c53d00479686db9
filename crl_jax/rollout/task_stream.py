"""The position-tracked stream of training tasks.

Tasks come from the train split in an order fixed by (seed, epoch): each epoch is a fresh
permutation. The stream's state is two integers, saved in every checkpoint, so a resumed run draws
exactly the tasks the uninterrupted run would have drawn.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class TaskStream:
    def __init__(self, tasks: Sequence[dict], seed: int):
        if not tasks:
            raise ValueError("the task split is empty")
        self.tasks = list(tasks)
        self.seed = seed
        self.epoch = 0
        self.position = 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.tasks))

    def take(self, n: int) -> list[dict]:
        out = []
        for _ in range(n):
            if self.position == len(self.tasks):
                self.epoch += 1
                self.position = 0
                self._order = self._permutation(self.epoch)
            out.append(self.tasks[int(self._order[self.position])])
            self.position += 1
        return out

    def state(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "size": len(self.tasks)}

    def restore(self, state: dict) -> None:
        if int(state["size"]) != len(self.tasks):
            raise ValueError(f"the checkpoint's task stream had {state['size']} tasks, the split has "
                             f"{len(self.tasks)}: the data changed since the run started")
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._order = self._permutation(self.epoch)
