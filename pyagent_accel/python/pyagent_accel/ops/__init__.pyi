from . import attention as attention
from . import block_table as block_table
from . import gguf as gguf
from . import hashing as hashing
from . import layers as layers
from . import lora as lora
from . import moe as moe
from . import pooling as pooling
from . import quant as quant
from . import rope as rope
from . import sampling as sampling
from . import spec_decode as spec_decode
from . import ssm as ssm
from . import structured as structured

MODULES: tuple[str, ...]

__all__ = [
    "MODULES",
    "attention",
    "block_table",
    "gguf",
    "hashing",
    "layers",
    "lora",
    "moe",
    "pooling",
    "quant",
    "rope",
    "sampling",
    "spec_decode",
    "ssm",
    "structured",
]
