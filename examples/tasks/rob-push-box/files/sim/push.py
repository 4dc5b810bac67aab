"""Grid pushing simulator (read-only for the task; a checksum is verified).

A robot moves on a grid one cell per action ('U', 'D', 'L', 'R'). Walking into
the box pushes it one cell in the same direction if that cell is free (not a
wall); otherwise the action has no effect. Walking into a wall has no effect.
Every action counts as one move, effective or not. The box can only be pushed,
never pulled.

Map files use: '#' wall, '.' floor, 'R' robot, 'B' box, 'G' goal (the goal is
floor), optionally '*' box on goal and '+' robot on goal.
"""
from collections import namedtuple

State = namedtuple("State", "walls robot box goal rows cols")
DIRS = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}


def load(path):
    with open(path) as f:
        lines = [ln.rstrip("\n") for ln in f if ln.strip()]
    walls, robot, box, goal = set(), None, None, None
    for r, line in enumerate(lines):
        for c, ch in enumerate(line):
            if ch == "#":
                walls.add((r, c))
            if ch in "R+":
                robot = (r, c)
            if ch in "B*":
                box = (r, c)
            if ch in "G*+":
                goal = (r, c)
    if robot is None or box is None or goal is None:
        raise ValueError(f"{path}: map needs a robot, a box and a goal")
    return State(frozenset(walls), robot, box, goal, len(lines), max(len(ln) for ln in lines))


def step(state, action):
    """Apply one action and return the new state (states are immutable)."""
    dr, dc = DIRS[action]
    nr = (state.robot[0] + dr, state.robot[1] + dc)
    if nr in state.walls:
        return state
    if nr == state.box:
        nb = (nr[0] + dr, nr[1] + dc)
        if nb in state.walls:
            return state
        return state._replace(robot=nr, box=nb)
    return state._replace(robot=nr)


def is_solved(state):
    return state.box == state.goal


def replay(path, actions):
    """Run an action string from the map's start. Returns (final_state, moves, pushes)."""
    s = load(path)
    pushes = 0
    for a in actions:
        nxt = step(s, a)
        pushes += nxt.box != s.box
        s = nxt
    return s, len(actions), pushes


def render(state):
    rows = []
    for r in range(state.rows):
        row = ""
        for c in range(state.cols):
            p = (r, c)
            if p in state.walls:
                row += "#"
            elif p == state.box:
                row += "*" if p == state.goal else "B"
            elif p == state.robot:
                row += "+" if p == state.goal else "R"
            elif p == state.goal:
                row += "G"
            else:
                row += "."
        rows.append(row)
    return "\n".join(rows)
