from . import hashing as hashing
from . import sampling as sampling

MODULES: tuple[str, ...]

__all__ = ["MODULES", "hashing", "sampling"]
