"""A stirred-tank water heater with a transport delay and a measured disturbance, binding `heater-1`.

Water flows through a well-mixed tank heated electrically (MV `q_heat`, kW); the inlet
temperature (DV `t_in`, degC) varies. The outlet temperature (CV `t_out`, degC) is measured at the
end of a pipe whose transport delay is 4 samples (40 s). The tank loses heat to the 20 degC room
as (T - T_room)^1.8 (convection plus evaporation grow faster than linearly), so the steady-state
gain from heater power to temperature falls by about a quarter across the operating range. The
binding leaves the model orders and delay unset: the product has to find them.
"""

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from scipy.optimize import brentq

from optimizer_pipeline.plants.base import Excitation, Plant

FLOW_HEAT = 0.8 * 4.18  # water flow times heat capacity, kW / K (0.8 kg/s)
HOLDUP_HEAT = 80.0 * 4.18  # tank content times heat capacity, kJ / K (80 kg)
LOSS = 0.08  # heat-loss coefficient, kW / K^LOSS_EXPONENT
LOSS_EXPONENT = 1.8
ROOM = 20.0  # degC

BINDING: dict[str, Any] = {
    "id": "heater-1",
    "unit": "stirred-tank heater with outlet transport delay",
    "sample_period_s": 10,
    "mvs": [{"tag": "q_heat", "lo": 0.0, "hi": 220.0, "max_move": 10.0}],
    "cvs": [{"tag": "t_out", "lo": 20.0, "hi": 75.0, "target": 50.0, "weight": 1.0}],
    "dvs": [{"tag": "t_in"}],
    "model": {"horizon": 15},
    "profile": {"id": "heater-track", "version": 1, "template": "linear_mpc_quadratic@1",
                "horizon": 40, "move_weight": 0.1, "valid_for_s": 3600},
}


def _heat_loss(temperature: Any) -> Any:
    """Heat lost to the room, kW; signed so a tank below room temperature gains heat."""
    excess = temperature - ROOM
    return LOSS * np.sign(excess) * np.abs(excess) ** LOSS_EXPONENT


@dataclass(frozen=True)
class DeadTimeHeater(Plant):
    """State: tank temperature (degC) plus the 4-sample pipe; MV kW; DV and CV degC. Time constant ~65 s."""

    name: ClassVar[str] = "heater"
    binding: ClassVar[dict[str, Any]] = BINDING
    n_cont: ClassVar[int] = 1
    settling_time_s: ClassVar[float] = 800.0  # ~65 s time constant plus the 40 s pipe
    delay_samples: ClassVar[int] = 4
    substeps: ClassVar[int] = 5
    cv_noise: ClassVar[tuple[float, ...]] = (0.1,)
    dv_noise: ClassVar[tuple[float, ...]] = (0.05,)
    nominal_d: ClassVar[tuple[float, ...]] = (15.0,)
    excitation: ClassVar[Excitation] = Excitation(
        mv_band=((50.0, 180.0),),
        mv_hold=(4, 25),
        mv_live=(100.0,),  # ~40 degC at 15 degC inlet; the target is 50 degC
        dv_band=((10.0, 20.0),),
        dv_hold=(30, 90),
        dv_rate=(0.1,),
        dv_live=(15.0,),
    )

    def _rhs(self, xc: np.ndarray, u: np.ndarray, d: np.ndarray) -> np.ndarray:
        temperature = xc[:, 0]
        balance = FLOW_HEAT * (d[:, 0] - temperature) + u[:, 0] - _heat_loss(temperature)
        return (balance / HOLDUP_HEAT)[:, None]

    def _outputs(self, xc: np.ndarray) -> np.ndarray:
        return xc[:, :1]

    def _equilibrium(self, u: np.ndarray, d: np.ndarray) -> np.ndarray:
        # The balance is strictly decreasing in T, so it has one root; bracket wide enough for any
        # power in the binding bounds.
        def balance(temperature: float) -> float:
            return FLOW_HEAT * (d[0] - temperature) + u[0] - float(_heat_loss(temperature))

        return np.array([brentq(balance, -100.0, 500.0, xtol=1e-12)])
