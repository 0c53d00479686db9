"""Sokoban 6x6 with 2 boxes: an in-repo level generator, the game rules and a solver-backed expert.

Owns: generating a level from a seed by reverse play (boxes start on their targets and the player
*pulls* them away, so undoing the pulls as pushes solves the level: every level is solvable by
construction), the push/move rules, the text grid, and `SokobanExpert` (an optimal-push solver from
push_planner, run on the true state).

Cells are (x, y), y grows downwards. Grid letters: # wall, _ floor, O target, X box, * box on target,
P you, S you on a target.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from crl_jax.envs import push_planner as pp
from crl_jax.envs.base import ScriptedAgent, TextEnv

MOVES = {"up": (0, -1), "down": (0, 1), "left": (-1, 0), "right": (1, 0)}
_WORD_OF_DELTA = {v: k for k, v in MOVES.items()}


def generate_level(seed: int, size: int = 6, num_boxes: int = 2, pull_steps: int = 60):
    """(walls, targets, boxes, player) for `seed`, deterministic and solvable by construction."""
    rng = np.random.default_rng([seed, size, num_boxes])
    for _ in range(1000):
        interior = [(x, y) for y in range(1, size - 1) for x in range(1, size - 1)]
        walls = {(x, y) for y in range(size) for x in range(size)} - set(interior)
        # A few inner walls make levels less uniform; keep the floor connected.
        for _ in range(int(rng.integers(0, 3))):
            cell = interior[int(rng.integers(len(interior)))]
            floor = set(interior) - walls - {cell}
            if len(floor) >= num_boxes * 2 + 4 and _connected(floor):
                walls.add(cell)
        floor = sorted(set(interior) - walls)
        picks = rng.choice(len(floor), size=num_boxes + 1, replace=False)
        targets = frozenset(floor[i] for i in picks[:num_boxes])
        player = floor[picks[-1]]
        boxes = set(targets)
        best = None
        for _ in range(pull_steps):
            d = list(MOVES.values())[int(rng.integers(4))]
            ahead = (player[0] + d[0], player[1] + d[1])
            if ahead in walls or ahead in boxes:
                continue
            behind = (player[0] - d[0], player[1] - d[1])
            if behind in boxes and rng.random() < 0.7:  # pull the box along
                boxes.remove(behind)
                boxes.add(player)
            player = ahead
            if not (boxes & targets):
                score = sum(min(abs(b[0] - t[0]) + abs(b[1] - t[1]) for t in targets)
                            for b in boxes)
                if best is None or score > best[0]:
                    best = (score, frozenset(boxes), player)
        if best is not None and best[0] >= 2:
            return frozenset(walls), targets, best[1], best[2]
    raise RuntimeError(f"sokoban: could not generate a level for seed {seed}")


def _connected(floor: set) -> bool:
    start = next(iter(floor))
    seen = pp.reachable(pp.PushWorld(frozenset(floor)), start, frozenset(), frozenset())
    return len(seen) == len(floor)


def solve_level(walls, targets, boxes, player, size: int = 6) -> list | None:
    """Optimal-push solution as a list of move words, or None if unsolvable."""
    floor = frozenset((x, y) for y in range(size) for x in range(size)) - frozenset(walls)
    world = pp.PushWorld(floor, pp.DIRS4)
    targets = frozenset(targets)

    def heuristic(bs, _water):
        return sum(min(abs(b[0] - t[0]) + abs(b[1] - t[1]) for t in targets) for b in bs)

    pushes = pp.solve(world, player, boxes, is_goal=lambda bs, ws, reach: bs == targets,
                      heuristic=heuristic, max_nodes=50_000)
    if pushes is None:
        return None
    moves = pp.plan_to_moves(world, player, boxes, (), pushes)
    return [_WORD_OF_DELTA[d] for d in moves]


class SokobanEnv(TextEnv):
    """6x6 Sokoban, 2 boxes; reward 1 when every box is on a target."""

    def __init__(self, size: int = 6, num_boxes: int = 2, max_turns: int = 30):
        super().__init__()
        if size < 5 or num_boxes < 1:
            raise ValueError(f"sokoban: need size >= 5 and num_boxes >= 1, got {size}, {num_boxes}")
        self.size, self.num_boxes, self.max_turns = size, num_boxes, max_turns
        self.name = f"sokoban/{size}x{size}-{num_boxes}box"
        self.system_prompt = (
            "You play Sokoban. Push every box onto a target. You move one square per action; "
            "walking into a box pushes it one square if the square behind it is free. Boxes cannot "
            "be pulled, and two boxes cannot be pushed at once.\n"
            "Legend: # wall, _ floor, O target, X box, * box on a target, P you, S you on a target.\n"
            f"Actions: {', '.join(MOVES)}.\n"
            "Think briefly, then give exactly one action as <answer>action</answer>, e.g. "
            "<answer>left</answer>."
        )

    def valid_actions(self) -> list[str]:
        return list(MOVES)

    def render(self) -> str:
        rows = []
        for y in range(self.size):
            row = ""
            for x in range(self.size):
                c = (x, y)
                if c in self.walls:
                    row += "#"
                elif c == self.player:
                    row += "S" if c in self.targets else "P"
                elif c in self.boxes:
                    row += "*" if c in self.targets else "X"
                else:
                    row += "O" if c in self.targets else "_"
            rows.append(row)
        return "\n".join(rows)

    def _reset(self, seed: int):
        level = generate_level(seed, self.size, self.num_boxes)
        self.walls, self.targets, boxes, self.player = level
        self.boxes = set(boxes)
        goal = f"Push all {self.num_boxes} boxes (X) onto the targets (O)."
        return self.render(), goal, {}

    def _step(self, action: str):
        d = MOVES[action]
        ahead = (self.player[0] + d[0], self.player[1] + d[1])
        message = ""
        if ahead in self.walls:
            message = "You bump into a wall."
        elif ahead in self.boxes:
            beyond = (ahead[0] + d[0], ahead[1] + d[1])
            if beyond in self.walls or beyond in self.boxes:
                message = "The box does not move: something blocks it."
            else:
                self.boxes.remove(ahead)
                self.boxes.add(beyond)
                self.player = ahead
        else:
            self.player = ahead
        success = self.boxes == set(self.targets)
        text = self.render() + (f"\n{message}" if message else "")
        if success:
            text += "\nAll boxes are on targets. Solved!"
        return text, (1.0 if success else 0.0), success, success, {}


class SokobanExpert(ScriptedAgent):
    """Solves the true state once per episode and replays the moves (re-solving if they diverge)."""

    def reset(self, env: SokobanEnv, observation: str, info: dict[str, Any]) -> None:
        if not isinstance(env, SokobanEnv):
            raise TypeError(f"SokobanExpert needs a SokobanEnv, got {type(env).__name__}")
        self.env = env
        self.moves: list[str] = []

    def act(self, observation: str, info: dict[str, Any]) -> str:
        env = self.env
        if not self.moves:
            self.moves = solve_level(env.walls, env.targets, frozenset(env.boxes), env.player,
                                     env.size) or ["up"]
        return f"<answer>{self.moves.pop(0)}</answer>"
