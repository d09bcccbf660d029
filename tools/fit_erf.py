"""The coefficients of `erf_f32` in pyagent_accel/src/layers.rs (GELU's erf in float32).

erfc(u) * exp(u**2) is smooth and slowly varying for u >= 0; in t = 1 / (1 + u / 2) it
is close to a low-degree polynomial. This interpolates it at Chebyshev nodes over the
u range float32 needs (erf(u) rounds to 1 in float32 from about 3.92 on) with Python's
`math.erfc`, converts to the power basis in s (t mapped affinely onto [-1, 1]) and
prints the coefficients, lowest degree first, with the largest |erf error| found on a
fine grid. Run: python tools/fit_erf.py
"""

from __future__ import annotations

import math

import numpy as np
from numpy.polynomial import chebyshev, polynomial

U_MAX = 3.95
DEGREE = 12
NODES = 400


def main() -> None:
    t_min = 1.0 / (1.0 + U_MAX / 2.0)
    k = np.arange(NODES)
    s = np.cos(math.pi * (k + 0.5) / NODES)
    u = 2.0 / (t_min + (1.0 - t_min) * (s + 1.0) / 2.0) - 2.0
    g = np.array([math.erfc(v) * math.exp(v * v) for v in u])
    coefficients = chebyshev.cheb2poly(chebyshev.chebfit(s, g, DEGREE))
    grid = np.linspace(0.0, U_MAX, 100_001)
    s_grid = (1.0 / (1.0 + grid / 2.0) - t_min) / (1.0 - t_min) * 2.0 - 1.0
    approx = 1.0 - np.exp(-grid * grid) * polynomial.polyval(s_grid, coefficients)
    error = np.max(np.abs(approx - np.array([math.erf(v) for v in grid])))
    print(f"t_min = {float(t_min)!r}")
    for c in coefficients:
        print(f"    {float(c)!r},")
    print(f"max |erf error| on [0, {U_MAX}]: {error:.2e}")


if __name__ == "__main__":
    main()
