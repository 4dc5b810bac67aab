"""DC motor position servo with a discrete PID controller (read-only; a checksum is verified).

Plant (armature inductance neglected):
    J * domega/dt = (Kt / R) * (V - Ke * omega) - b * omega - tau_load
    dtheta/dt     = omega
The controller runs every DT seconds on an angle measurement that is DELAY
periods old and holds its voltage (zero-order hold);
the plant is integrated with SUBSTEPS semi-implicit Euler steps per control
period. The voltage saturates at +/- V_MAX. The PID uses derivative on
measurement (no derivative kick) and conditional integration (the integrator
is frozen while the output is saturated and the error would push it further).
"""

DT = 0.002          # controller period [s]
SUBSTEPS = 4
V_MAX = 12.0        # actuator saturation [V]
DELAY = 5           # the angle measurement reaching the controller is DELAY periods old
PARAMS = {
    "J": 0.02,      # inertia [kg m^2]
    "b": 0.05,      # viscous friction [N m s/rad]
    "Kt": 0.6,      # torque constant [N m/A]
    "Ke": 0.6,      # back-EMF constant [V s/rad]
    "R": 2.0,       # armature resistance [ohm]
    "tau_load": 0.3,  # constant load torque acting in the -theta direction [N m]
}


def simulate(kp, ki, kd, T=3.0, setpoint=1.0, inertia_scale=1.0):
    """Step response from rest. Returns (times, angles, voltages) sampled every DT, starting at t = 0."""
    p = dict(PARAMS)
    J = p["J"] * inertia_scale
    h = DT / SUBSTEPS
    theta = omega = integ = 0.0
    meas = [0.0] * (DELAY + 1)      # meas[0] is the delayed reading the controller sees
    prev_y = 0.0
    ts, ths, us = [], [], []
    n = int(round(T / DT))
    for k in range(n + 1):
        t = k * DT
        meas = meas[1:] + [theta]
        y = meas[0]
        e = setpoint - y
        deriv = -(y - prev_y) / DT if k > 0 else 0.0
        prev_y = y
        u_unsat = kp * e + ki * integ + kd * deriv
        u = max(-V_MAX, min(V_MAX, u_unsat))
        if u == u_unsat or (u_unsat > V_MAX and e < 0) or (u_unsat < -V_MAX and e > 0):
            integ += e * DT
        ts.append(t)
        ths.append(theta)
        us.append(u)
        for _ in range(SUBSTEPS):
            torque = p["Kt"] / p["R"] * (u - p["Ke"] * omega) - p["b"] * omega - p["tau_load"]
            omega += h * torque / J
            theta += h * omega
    return ts, ths, us


if __name__ == "__main__":
    t, th, u = simulate(20.0, 10.0, 1.0)
    print(f"theta(T) = {th[-1]:.5f}, max = {max(th):.5f}")
