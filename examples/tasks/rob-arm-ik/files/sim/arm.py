"""Planar 3-link arm simulator (read-only for the task; a checksum is verified).

Joint angles are in radians. q1 is measured from the +x axis, q2 and q3 are
relative to the previous link. The end-effector orientation is phi = q1+q2+q3.
"""
import math

LINKS = (1.0, 0.8, 0.3)                      # link lengths in metres
JOINT_LIMITS = ((-math.pi, math.pi),          # q1
                (-math.pi, math.pi),          # q2
                (-1.9, 1.9))                  # q3 (wrist) is limited


def wrap(a):
    """Wrap an angle to (-pi, pi]."""
    a = math.fmod(a + math.pi, 2 * math.pi)
    if a <= 0:
        a += 2 * math.pi
    return a - math.pi


def joint_positions(q):
    """Base, elbow, wrist and tool points [(x, y), ...] for joint angles q = (q1, q2, q3)."""
    x = y = th = 0.0
    pts = [(0.0, 0.0)]
    for length, qi in zip(LINKS, q):
        th += qi
        x += length * math.cos(th)
        y += length * math.sin(th)
        pts.append((x, y))
    return pts


def forward(q):
    """End-effector pose (x, y, phi) with phi wrapped to (-pi, pi]."""
    if len(q) != 3:
        raise ValueError("expected three joint angles")
    x, y = joint_positions(q)[-1]
    return x, y, wrap(sum(q))


def within_limits(q, tol=1e-9):
    return all(lo - tol <= qi <= hi + tol for qi, (lo, hi) in zip(q, JOINT_LIMITS))


if __name__ == "__main__":
    print(forward((0.3, 0.6, -0.2)))
