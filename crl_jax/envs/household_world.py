"""Scene generation for the in-repo household environment (an offline ALFWorld analogue).

Owns the tables that make the world (room types, their receptacles, which objects live in which
room, the placement priors, the task families) and `generate_scene(seed, families)`, which turns a
seed into a fully specified episode: receptacles, objects with their locations, and the task.

Placement is drawn from per-object priors (a mug is usually in a cabinet or the coffee machine, an
egg usually in the fridge), so an agent that remembers where things were in earlier episodes finds
them faster: this is the structure cross-episode experience can exploit.
"""

from __future__ import annotations

import dataclasses
import random

# Receptacles that must be opened before their contents can be seen or used.
OPENABLE = frozenset({"cabinet", "drawer", "fridge", "microwave", "safe"})
# Receptacles an object goes *in*; all others an object goes *on*.
CONTAINERS = frozenset({"cabinet", "drawer", "fridge", "microwave", "safe", "sinkbasin",
                        "bathtubbasin", "garbagecan"})

# room -> receptacle type -> (min count, max count)
ROOMS: dict[str, dict[str, tuple[int, int]]] = {
    "kitchen": {"cabinet": (3, 6), "drawer": (2, 4), "countertop": (1, 3), "fridge": (1, 1),
                "microwave": (1, 1), "sinkbasin": (1, 1), "stoveburner": (2, 4),
                "coffeemachine": (1, 1), "toaster": (1, 1), "garbagecan": (1, 1),
                "diningtable": (0, 1), "shelf": (0, 2)},
    "livingroom": {"sofa": (1, 1), "armchair": (0, 2), "coffeetable": (1, 1), "sidetable": (1, 2),
                   "tvstand": (1, 1), "shelf": (1, 3), "drawer": (1, 3), "cabinet": (0, 2),
                   "garbagecan": (1, 1)},
    "bedroom": {"bed": (1, 1), "desk": (1, 1), "drawer": (2, 5), "dresser": (1, 1),
                "shelf": (1, 3), "sidetable": (1, 2), "garbagecan": (1, 1), "safe": (0, 1)},
    "bathroom": {"sinkbasin": (1, 2), "toilet": (1, 1), "bathtubbasin": (1, 1), "cabinet": (2, 4),
                 "countertop": (1, 1), "drawer": (1, 3), "garbagecan": (1, 1),
                 "towelholder": (1, 1), "toiletpaperhanger": (1, 1)},
}

# room -> object type -> receptacle-type weights (the placement prior). Weights on receptacle types
# a scene lacks are dropped; every object lists at least one receptacle its room always has.
PRIORS: dict[str, dict[str, dict[str, int]]] = {
    "kitchen": {
        "mug": {"cabinet": 4, "coffeemachine": 4, "countertop": 1, "sinkbasin": 1},
        "cup": {"cabinet": 5, "countertop": 1, "shelf": 1, "fridge": 1},
        "apple": {"fridge": 5, "countertop": 2, "diningtable": 2, "garbagecan": 1},
        "egg": {"fridge": 6, "countertop": 1, "garbagecan": 1},
        "potato": {"fridge": 3, "countertop": 3, "diningtable": 1, "garbagecan": 1},
        "tomato": {"fridge": 5, "countertop": 2, "diningtable": 1},
        "lettuce": {"fridge": 6, "countertop": 1, "diningtable": 1},
        "bread": {"countertop": 4, "diningtable": 2, "fridge": 1, "toaster": 1},
        "plate": {"cabinet": 5, "countertop": 1, "diningtable": 2},
        "bowl": {"cabinet": 4, "shelf": 1, "countertop": 1, "fridge": 1},
        "pan": {"stoveburner": 5, "cabinet": 2},
        "pot": {"stoveburner": 5, "cabinet": 2},
        "knife": {"drawer": 5, "countertop": 2},
        "spoon": {"drawer": 6, "countertop": 1},
        "fork": {"drawer": 6, "diningtable": 1},
        "winebottle": {"cabinet": 2, "countertop": 2, "fridge": 2},
    },
    "livingroom": {
        "remotecontrol": {"sofa": 4, "coffeetable": 4, "armchair": 1, "tvstand": 1},
        "book": {"shelf": 5, "coffeetable": 1, "sidetable": 1},
        "vase": {"shelf": 4, "sidetable": 1, "tvstand": 1},
        "keychain": {"drawer": 4, "sidetable": 2, "coffeetable": 1},
        "pillow": {"sofa": 5, "armchair": 2},
        "newspaper": {"coffeetable": 4, "sofa": 1, "sidetable": 1},
        "statue": {"shelf": 4, "tvstand": 1},
        "watch": {"sidetable": 3, "drawer": 3},
        "creditcard": {"drawer": 4, "coffeetable": 1, "sidetable": 1},
    },
    "bedroom": {
        "book": {"shelf": 4, "desk": 2, "bed": 1, "sidetable": 1},
        "cellphone": {"bed": 3, "sidetable": 3, "desk": 2, "drawer": 1},
        "pencil": {"desk": 4, "drawer": 4},
        "pen": {"desk": 4, "drawer": 4},
        "alarmclock": {"sidetable": 5, "desk": 2, "shelf": 1},
        "laptop": {"desk": 5, "bed": 2},
        "cd": {"drawer": 4, "shelf": 1, "desk": 1, "safe": 2},
        "keychain": {"dresser": 4, "drawer": 2, "safe": 2},
        "creditcard": {"desk": 2, "drawer": 3, "dresser": 1, "safe": 2},
        "pillow": {"bed": 6},
    },
    "bathroom": {
        "soapbar": {"bathtubbasin": 3, "countertop": 3, "cabinet": 2, "sinkbasin": 2},
        "cloth": {"cabinet": 5, "countertop": 1, "bathtubbasin": 1},
        "candle": {"countertop": 3, "cabinet": 2, "toilet": 1},
        "spraybottle": {"cabinet": 4, "toilet": 2},
        "toiletpaper": {"toiletpaperhanger": 4, "cabinet": 2, "toilet": 1},
        "soapbottle": {"countertop": 4, "cabinet": 2, "toilet": 1},
        "towel": {"towelholder": 6, "cabinet": 1},
        "dishsponge": {"cabinet": 3, "countertop": 2, "sinkbasin": 1},
        "tissuebox": {"countertop": 3, "toilet": 2, "cabinet": 1},
    },
}

# Family -> (rooms it happens in, object types it may target, the appliance it needs).
FAMILIES: dict[str, tuple[tuple[str, ...], frozenset[str] | None, str | None]] = {
    "pick_and_place": (("kitchen", "livingroom", "bedroom", "bathroom"), None, None),
    "heat": (("kitchen",), frozenset({"mug", "cup", "apple", "egg", "potato", "tomato", "bread",
                                      "plate"}), "microwave"),
    "cool": (("kitchen",), frozenset({"mug", "cup", "apple", "potato", "tomato", "lettuce", "bread",
                                      "bowl", "pan", "pot", "winebottle"}), "fridge"),
    "clean": (("kitchen", "bathroom"), frozenset({"mug", "cup", "apple", "tomato", "lettuce", "plate",
                                                   "bowl", "pan", "pot", "knife", "spoon", "fork",
                                                   "soapbar", "cloth", "dishsponge"}), "sinkbasin"),
    "examine": (("livingroom", "bedroom"), frozenset({"book", "cellphone", "pencil", "pen",
                                                       "alarmclock", "cd", "keychain", "creditcard",
                                                       "remotecontrol", "vase", "statue",
                                                       "newspaper", "watch"}), "desklamp"),
}
# Where the desk lamp of an examine task stands.
LAMP_HOLDERS = ("sidetable", "desk", "dresser")
# Objects too big to carry: never targets, never taken.
FIXED = frozenset({"desklamp"})


@dataclasses.dataclass
class Scene:
    """One episode's world. Names are ALFWorld style: "cabinet 2", "mug 1"."""

    room: str
    family: str
    target_type: str  # the object type the task is about
    destination_type: str | None  # receptacle type it must end in/on (None for examine)
    receptacles: list[str]  # in the order the room description lists them
    contents: dict[str, list[str]]  # receptacle -> objects in/on it, in placement order
    goal: str


def receptacle_type(name: str) -> str:
    return name.rsplit(" ", 1)[0]


def _weighted_choice(rng: random.Random, weights: dict[str, int]) -> str:
    keys = sorted(weights)
    return rng.choices(keys, weights=[weights[k] for k in keys])[0]


def _goal_text(family: str, target: str, destination: str | None) -> str:
    prep = "in" if destination in CONTAINERS else "on"
    if family == "pick_and_place":
        return f"put some {target} {prep} {destination}."
    if family == "examine":
        return f"look at {target} under the desklamp."
    verb = {"heat": "heat", "cool": "cool", "clean": "clean"}[family]
    return f"{verb} some {target} and put it {prep} {destination}."


def generate_scene(seed: int, families: tuple[str, ...]) -> Scene:
    """Deterministic scene for `seed`; string seeding makes it independent of PYTHONHASHSEED."""
    rng = random.Random(f"household-v1/{seed}")
    family = families[rng.randrange(len(families))]
    rooms, allowed_targets, appliance = FAMILIES[family]
    room = rooms[rng.randrange(len(rooms))]

    counts = {kind: rng.randint(lo, hi) for kind, (lo, hi) in sorted(ROOMS[room].items())}
    receptacles = [f"{kind} {i}" for kind, n in counts.items() for i in range(1, n + 1)]
    rng.shuffle(receptacles)
    present = {kind for kind, n in counts.items() if n > 0}
    contents: dict[str, list[str]] = {r: [] for r in receptacles}

    candidates = sorted(t for t in PRIORS[room] if allowed_targets is None or t in allowed_targets)
    target = candidates[rng.randrange(len(candidates))]

    def place(obj_type: str, avoid: set[str]) -> str:
        weights = {k: w for k, w in PRIORS[room][obj_type].items() if k in present and k not in avoid}
        kind = _weighted_choice(rng, weights)
        holders = [r for r in receptacles if receptacle_type(r) == kind]
        return holders[rng.randrange(len(holders))]

    # The destination is a receptacle type that holds no target initially, so the task is never
    # already solved; appliances the task uses are not destinations.
    destination = None
    target_homes = {k for k in PRIORS[room][target] if k in present}
    if family != "examine":
        excluded = target_homes | {"microwave", "fridge", "sinkbasin"} if family != "pick_and_place" \
            else target_homes
        options = sorted(present - excluded - {"toaster", "coffeemachine"} - (
            {"toiletpaperhanger", "towelholder"} if family != "pick_and_place" else set()))
        if not options:  # every receptacle type is a home of the target: place it elsewhere
            options = sorted(present - target_homes) or sorted(present)
        destination = options[rng.randrange(len(options))]
    for i in range(1, rng.randint(1, 2) + 1):
        contents[place(target, {destination})].append(f"{target} {i}")
    distractor_types = sorted(t for t in PRIORS[room] if t != target)
    for obj_type in rng.sample(distractor_types, k=min(len(distractor_types), rng.randint(5, 8))):
        for i in range(1, rng.randint(1, 2) + 1):
            contents[place(obj_type, set())].append(f"{obj_type} {i}")
    if family == "examine" or room in ("livingroom", "bedroom"):
        holders = [r for r in receptacles if receptacle_type(r) in LAMP_HOLDERS]
        contents[holders[rng.randrange(len(holders))]].append("desklamp 1")
    for objs in contents.values():
        rng.shuffle(objs)
    return Scene(room=room, family=family, target_type=target, destination_type=destination,
                 receptacles=receptacles, contents=contents,
                 goal=_goal_text(family, target, destination))
