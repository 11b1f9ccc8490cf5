"""Planning: turning a graph into a plan of kernels for one device (storage planning so far)."""

from .storage import ArenaPlan, Lifetime, live_peak, plan_arena

__all__ = ["ArenaPlan", "Lifetime", "live_peak", "plan_arena"]
