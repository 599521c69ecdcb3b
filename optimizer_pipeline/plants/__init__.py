"""Registry of the demo plants (nonlinear simulators with bindings and history) used by `demo` and tests."""

from optimizer_pipeline.plants.base import DemoHistory, Excitation, LiveState, Plant, PlantInputError
from optimizer_pipeline.plants.blend import BlendTank, EconomicBlendTank
from optimizer_pipeline.plants.heater import DeadTimeHeater
from optimizer_pipeline.plants.tanks import QuadrupleTank

PLANTS: dict[str, type[Plant]] = {cls.name: cls for cls in (QuadrupleTank, DeadTimeHeater, BlendTank,
                                                                  EconomicBlendTank)}


class UnknownPlantError(PlantInputError):
    """A demo plant name that is not in the registry."""


def get_plant(name: str) -> Plant:
    """The nominal demo plant called `name` (a key of PLANTS)."""
    try:
        return PLANTS[name]()
    except KeyError:
        raise UnknownPlantError(f"demo plant {name!r} is unknown (known: {', '.join(PLANTS)})") from None


def demo_plants() -> list[Plant]:
    """Every nominal demo plant, in registry order (tanks, heater, blend, blend-econ)."""
    return [cls() for cls in PLANTS.values()]


__all__ = ["PLANTS", "BlendTank", "DeadTimeHeater", "EconomicBlendTank", "DemoHistory", "Excitation", "LiveState", "Plant",
           "PlantInputError", "QuadrupleTank", "UnknownPlantError", "demo_plants", "get_plant"]
