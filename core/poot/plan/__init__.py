"""Planning: a graph becomes a plan of kernel launches for a device, with storage planned per step shape."""

from .common import MATMUL_PRECISIONS
from .lower import Limits, compile_plan, plan_graph
from .memory import StoragePlan, plan_storage, storage_dtype
from .plan import Launch, Plan, When
from .storage import ArenaPlan, Lifetime, live_peak, plan_arena

__all__ = [
    "ArenaPlan",
    "Launch",
    "Lifetime",
    "Limits",
    "MATMUL_PRECISIONS",
    "Plan",
    "StoragePlan",
    "When",
    "compile_plan",
    "live_peak",
    "plan_arena",
    "plan_graph",
    "plan_storage",
    "storage_dtype",
]
