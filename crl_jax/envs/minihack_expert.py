"""Scripted expert for the MiniHack tasks, planning on privileged state.

Owns the planner that reads the hidden full map (`MiniHackEnv.privileged_map`) plus the live screen:
- Room / MazeWalk: shortest path to the stairs, around the known trap and around monsters (attacking
  one only when it blocks the only way).
- KeyRoom: walk to the key, pick it up, stand orthogonally next to the locked door, apply, then walk
  through the doorway (never diagonally) to the stairs.
- River: a push plan (push_planner) that fills water with boulders until the stairs are reachable,
  re-planned whenever the screen differs from the plan's prediction (a boulder may sink unfilled).
A move that leaves the agent in place is remembered as blocked so the next plan avoids it.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np

from crl_jax.envs import push_planner as pp
from crl_jax.envs.base import ScriptedAgent
from crl_jax.envs.minihack import DIRECTION_DELTAS, MiniHackEnv

_WORD_OF_DELTA = {v: k for k, v in DIRECTION_DELTAS.items()}
_WALKABLE = set(".>(<^#{_`")  # static-map characters a player may stand on (boulders move away)
_MONSTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ@&';:"


def _cells(grid: np.ndarray, chars: str) -> set:
    ys, xs = np.nonzero(np.isin(grid, list(chars)))
    return {(int(x), int(y)) for x, y in zip(xs, ys)}


class MiniHackExpert(ScriptedAgent):
    """Privileged planner for `MiniHackEnv`; `act` returns `<answer>word</answer>`."""

    def reset(self, env: MiniHackEnv, observation: str, info: dict[str, Any]) -> None:
        if not isinstance(env, MiniHackEnv):
            raise TypeError(f"MiniHackExpert needs a MiniHackEnv, got {type(env).__name__}")
        self.env = env
        static = env.privileged_map()
        self.stairs = next(iter(_cells(static, ">")), None)
        # A monster standing on the stairs hides them on the hidden map: its cell is a candidate.
        self.stair_candidates = (
            {self.stairs} if self.stairs else _cells(static, _MONSTERS) - {env.player_xy})
        self.traps = _cells(static, "^")
        # Items out of the hidden agent's line of sight are not on the hidden map (premapping shows
        # terrain only), so the key may have to be found by exploring.
        self.key = next(iter(_cells(static, "(")), None)
        self.start = env.player_xy
        self.door = next(iter(_cells(static, "+")), None)
        # Monsters (and the agent itself) stand on floor that the hidden map shows as their letter.
        self.floor = _cells(static, "".join(_WALKABLE) + _MONSTERS + "}")
        self.blocked_moves: set = set()
        self._rng = random.Random(info.get("seed", 0))
        self._last = None  # (position, move) of the previous step, to detect bumping
        self._plan: list = []  # River: [(expected state, move)]
        self.__dict__.pop("_belief", None)
        self.__dict__.pop("_river_static", None)

    # ---- helpers -------------------------------------------------------------------------------
    def _world(self, door_open: bool) -> pp.PushWorld:
        floor = set(self.floor)
        if self.door is not None and door_open:
            floor.add(self.door)
        no_box = frozenset({self.stairs} if self.stairs else ())
        return pp.PushWorld(frozenset(floor), pp.DIRS8, no_box)

    def _legal(self, pos, d) -> bool:
        """NetHack forbids diagonal steps into or out of a doorway."""
        if (pos, d) in self.blocked_moves:
            return False
        if d[0] and d[1] and self.door is not None:
            if pos == self.door or (pos[0] + d[0], pos[1] + d[1]) == self.door:
                return False
        return True

    def _path(self, world, start, goal_cells, avoid) -> list | None:
        """BFS honouring doorway and blocked-move rules; `avoid` cells are entered only as goals.

        Among shortest paths it takes the one whose first move is the compass direction of the
        goal (diagonal while both offsets are non-zero), the word the observation's `You see:`
        line gives: the demonstrations then say what the observation says whenever that is
        optimal, rather than an arbitrary tie-break the cloned actor cannot read."""
        import collections

        parent = {start: None}
        queue = collections.deque([start])
        while queue:
            cell = queue.popleft()
            if cell in goal_cells:
                path = []
                while parent[cell] is not None:
                    cell, d = parent[cell]
                    path.append(d)
                return path[::-1]
            dirs = self._toward(start, goal_cells, world.dirs) if cell == start else world.dirs
            for d in dirs:
                nxt = (cell[0] + d[0], cell[1] + d[1])
                if nxt in parent or nxt not in world.floor or not self._legal(cell, d):
                    continue
                if nxt in avoid and nxt not in goal_cells:
                    continue
                parent[nxt] = (cell, d)
                queue.append(nxt)
        return None

    @staticmethod
    def _toward(start, goal_cells, dirs) -> list:
        """`dirs` with the compass direction of the nearest goal cell first (BFS keeps that
        order, so the first shortest path found starts with it when one does)."""
        if not goal_cells:
            return list(dirs)
        goal = min(goal_cells, key=lambda c: (max(abs(c[0] - start[0]), abs(c[1] - start[1])), c))
        compass = (int(np.sign(goal[0] - start[0])), int(np.sign(goal[1] - start[1])))
        return sorted(dirs, key=lambda d: d != compass)

    def _go(self, world, pos, goal_cells, monsters) -> tuple:
        for avoid in (self.traps | monsters, monsters, self.traps, set()):
            path = self._path(world, pos, goal_cells, avoid)
            if path:
                return path[0]
        # Nothing reachable: forget bumps (a monster may have stood there) and step somewhere.
        self.blocked_moves.clear()
        options = [d for d in pp.DIRS8 if (pos[0] + d[0], pos[1] + d[1]) in world.floor
                   and self._legal(pos, d)] or list(pp.DIRS8)
        return options[self._rng.randrange(len(options))]

    # ---- acting --------------------------------------------------------------------------------
    def act(self, observation: str, info: dict[str, Any]) -> str:
        env = self.env
        pos = env.player_xy
        live = env.full_chars()
        if self._last is not None and self._last[0] == pos and self._last[1] in pp.DIRS8:
            message = observation.lower()
            if "attack" not in message and "hit" not in message and "miss" not in message:
                self.blocked_moves.add((pos, self._last[1]))
        monsters = {c for c in _cells(live, _MONSTERS)
                    if c != pos}
        if env.task == "river-narrow":
            move = self._river_move(pos, live)
        elif env.task == "keyroom-dark-s5":
            move = self._keyroom_move(pos, live, monsters, observation)
        else:
            shown = _cells(live, ">")
            if shown:
                self.stairs, self.stair_candidates = next(iter(shown)), shown
            self.stair_candidates.discard(pos)
            move = self._go(self._world(False), pos, self.stair_candidates, monsters)
        self._last = (pos, move)
        word = move if isinstance(move, str) else _WORD_OF_DELTA[move]
        return f"<answer>{word}</answer>"

    def _keyroom_move(self, pos, live, monsters, observation):
        if not self.env.has_key():
            if "see here" in observation and "key" in observation:
                self.key = pos
            seen_keys = _cells(live, "(")
            key = self.key if self.key is not None else next(iter(seen_keys), None)
            if key is None:
                # Explore the dark room: head for a cell next to floor never seen on the screen.
                unseen = {c for c in self.floor if live[c[1], c[0]] == " " and c != self.start}
                frontier = {(x + dx, y + dy) for x, y in unseen for dx, dy in pp.DIRS8} & self.floor
                frontier -= unseen
                # Nothing left unseen: the key lies under where the agent started.
                key = self.start if not frontier else None
                if key is None:
                    return self._go(self._world(False), pos, frontier, monsters)
            if pos == key:
                return "pick up"
            return self._go(self._world(False), pos, {key}, monsters)
        door_open = live[self.door[1], self.door[0]] not in "+ "
        if not door_open:
            beside = {(self.door[0] + dx, self.door[1] + dy) for dx, dy in pp.DIRS4}
            beside &= self.floor
            if pos in beside:
                return "apply"
            return self._go(self._world(False), pos, beside, monsters)
        return self._go(self._world(True), pos, {self.stairs}, monsters)

    def _river_map(self):
        if not hasattr(self, "_river_static"):
            self._river_static = self.env.privileged_map()
        return self._river_static

    def _river_move(self, pos, live):
        # Belief map: the hidden initial map, overwritten by whatever the screen shows now (the
        # agent does not see the whole river at once, and boulders only move when pushed).
        if not hasattr(self, "_belief"):
            self._belief = self.env.privileged_map().copy()
            self._belief[self._belief == "@"] = "."
        shown = (live != " ") & ~np.isin(live, list(_MONSTERS))
        self._belief[shown] = live[shown]
        self._belief[pos[1], pos[0]] = "."  # a boulder pushed from here has left it
        boulders = frozenset(_cells(self._belief, "`"))
        water = frozenset(_cells(self._belief, "}"))
        state = (pos, boulders, water)
        if not self._plan or self._plan[0][0] != state:
            self._plan = self._plan_river(pos, boulders, water)
        if not self._plan:
            return self._go(self._world(False), pos, {self.stairs}, set())
        return self._plan.pop(0)[1]

    def _plan_river(self, pos, boulders, water) -> list:
        floor = self._world(False).floor
        # Boulders only ever need to travel towards the river (east), so pushes west are pruned.
        world = pp.PushWorld(floor, pp.DIRS8, frozenset({self.stairs}),
                             push_dirs=tuple(d for d in pp.DIRS8 if d[0] >= 0))
        stairs = self.stairs
        xs = sorted({x for x, _ in _cells(self._river_map(), "}")})
        near_x, far_x = xs[0], xs[-1]

        def heuristic(bs, ws):
            # A crossing needs one filled cell in each water column, in the same or adjacent rows
            # (the agent may cross diagonally). Cost: Chebyshev distances from distinct boulders.
            def cost(cell, exclude=None):
                if cell not in ws:
                    return 0, None
                best = (float("inf"), None)
                for b in bs:
                    if b != exclude:
                        best = min(best, (max(abs(b[0] - cell[0]), abs(b[1] - cell[1])), b))
                return best

            best = float("inf")
            rows = {y for _, y in self.floor}
            for y in rows:
                c1, b1 = cost((near_x, y))
                if c1 >= best:
                    continue
                for y2 in (y - 1, y, y + 1):
                    if y2 in rows:
                        c2, _ = cost((far_x, y2), exclude=b1)
                        best = min(best, c1 + c2)
            return best

        plan = pp.solve(world, pos, boulders, water,
                        is_goal=lambda bs, ws, reach: stairs in reach,
                        heuristic=heuristic, weight=2.0, max_nodes=3_000,
                        forbidden=frozenset(self.blocked_moves))
        if plan is None:
            return []
        moves = pp.plan_to_moves(world, pos, boulders, water, plan)
        if moves is None:
            return []
        # Predict the state before each move so that a divergence triggers a re-plan.
        steps, player, bs, ws = [], pos, set(boulders), set(water)
        for d in moves:
            steps.append(((player, frozenset(bs), frozenset(ws)), d))
            nxt = (player[0] + d[0], player[1] + d[1])
            if nxt in bs:
                pp.push_box(bs, ws, nxt, d)
            player = nxt
        path_to_goal = pp.walk_path(world, player, stairs, bs, ws)
        for d in path_to_goal or []:
            steps.append(((player, frozenset(bs), frozenset(ws)), d))
            player = (player[0] + d[0], player[1] + d[1])
        return steps
