"""Box-pushing planner shared by the Sokoban expert and the MiniHack River expert.

Owns: a best-first search over push states (box positions, remaining water, the region the player
can reach), and turning a push plan into single steps. Cells are (x, y) with y growing southwards.
Water is NetHack's rule: a box pushed into water fills it (the cell becomes floor, the box is gone);
the player cannot enter water. Sokoban uses four directions and no water; MiniHack uses eight.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import itertools
from typing import Callable, Iterable

Cell = tuple[int, int]
DIRS4 = ((0, -1), (0, 1), (-1, 0), (1, 0))
DIRS8 = DIRS4 + ((1, -1), (1, 1), (-1, 1), (-1, -1))


@dataclasses.dataclass(frozen=True)
class PushWorld:
    floor: frozenset  # cells players and boxes may stand on (no walls, no water)
    dirs: tuple = DIRS4
    no_box: frozenset = frozenset()  # boxes are never pushed onto these (e.g. the stairs)
    push_dirs: tuple | None = None  # directions worth pushing in (default: all of `dirs`)


def _add(c: Cell, d: Cell) -> Cell:
    return c[0] + d[0], c[1] + d[1]


def reachable(world: PushWorld, player: Cell, boxes: frozenset, water: frozenset) -> set:
    """Cells the player can walk to without moving a box."""
    seen = {player}
    queue = collections.deque([player])
    while queue:
        cell = queue.popleft()
        for d in world.dirs:
            nxt = _add(cell, d)
            if nxt not in seen and nxt in world.floor and nxt not in boxes and nxt not in water:
                seen.add(nxt)
                queue.append(nxt)
    return seen


def walk_path(world: PushWorld, start: Cell, target: Cell, boxes, water, blocked=()) -> list | None:
    """Shortest list of directions from start to target not touching boxes/water/blocked."""
    if start == target:
        return []
    parent = {start: None}
    queue = collections.deque([start])
    while queue:
        cell = queue.popleft()
        for d in world.dirs:
            nxt = _add(cell, d)
            if nxt in parent or nxt not in world.floor or nxt in boxes or nxt in water:
                continue
            if nxt in blocked and nxt != target:
                continue
            parent[nxt] = (cell, d)
            if nxt == target:
                path = []
                while parent[nxt] is not None:
                    nxt, d = parent[nxt]
                    path.append(d)
                return path[::-1]
            queue.append(nxt)
    return None


def solve(
    world: PushWorld,
    player: Cell,
    boxes: Iterable[Cell],
    water: Iterable[Cell] = (),
    *,
    is_goal: Callable[[frozenset, frozenset, set], bool],
    heuristic: Callable[[frozenset, frozenset], float],
    weight: float = 1.0,
    max_nodes: int = 200_000,
    forbidden: frozenset = frozenset(),
) -> list | None:
    """Best-first search for a push sequence [(box cell, direction), ...] reaching `is_goal`.

    `is_goal(boxes, water, reach)` sees the player's reachable set; `heuristic` estimates the pushes
    left. weight=1 gives shortest push plans with an admissible heuristic; >1 trades length for speed.
    `forbidden` holds (player cell, direction) pushes known to fail (e.g. stacked boulders).
    """
    boxes, water = frozenset(boxes), frozenset(water)
    counter = itertools.count()
    reach = reachable(world, player, boxes, water)
    start = (boxes, water, min(reach))
    parents = {start: None}
    frontier = [(weight * heuristic(boxes, water), 0, next(counter), start, player)]
    expanded = 0
    while frontier and expanded < max_nodes:
        _, g, _, key, pos = heapq.heappop(frontier)
        boxes, water, _ = key
        reach = reachable(world, pos, boxes, water)
        if is_goal(boxes, water, reach):
            plan = []
            while parents[key] is not None:
                key, push = parents[key]
                plan.append(push)
            return plan[::-1]
        expanded += 1
        for box in boxes:
            for d in world.push_dirs or world.dirs:
                behind, ahead = (box[0] - d[0], box[1] - d[1]), _add(box, d)
                if behind not in reach or ahead in boxes or ahead in world.no_box:
                    continue
                if (behind, d) in forbidden:
                    continue
                if ahead in water:
                    new_boxes, new_water = boxes - {box}, water - {ahead}
                elif ahead in world.floor:
                    new_boxes, new_water = (boxes - {box}) | {ahead}, water
                else:
                    continue
                new_reach_key = min(reachable(world, box, new_boxes, new_water))
                new_key = (new_boxes, new_water, new_reach_key)
                if new_key in parents:
                    continue
                parents[new_key] = (key, (box, d))
                h = heuristic(new_boxes, new_water)
                heapq.heappush(frontier, (g + 1 + weight * h, g + 1, next(counter), new_key, box))
    return None


def plan_to_moves(world: PushWorld, player: Cell, boxes, water, pushes) -> list | None:
    """Expand a push plan into single player steps (directions)."""
    boxes, water = set(boxes), set(water)
    moves = []
    for box, d in pushes:
        behind = (box[0] - d[0], box[1] - d[1])
        path = walk_path(world, player, behind, boxes, water)
        if path is None:
            return None
        moves.extend(path)
        moves.append(d)
        push_box(boxes, water, box, d)
        player = box
    return moves


def push_box(boxes: set, water: set, box, d) -> None:
    """Push `box` one cell along `d`: into water it fills the cell (both are gone), else it
    lands there."""
    ahead = _add(box, d)
    boxes.discard(box)
    if ahead in water:
        water.discard(ahead)
    else:
        boxes.add(ahead)
