"""Profiling: one step of a loaded model, launch by launch (``poot profile``).

``profile_step(handle, tokens, batch)`` builds the step the engine would run, times each launch on
the device (the executor's ``profile``), accounts each launch's bytes and FLOPs from the plan
(``costs``), and sets them against the device's peak (the executor's ``peak``). ``format_profile``,
``write_trace`` (Chrome/Perfetto JSON) and ``plot_roofline`` (matplotlib, optional) show it."""

from .costs import LaunchCost, launch_costs
from .report import chrome_trace, format_profile, plot_roofline, write_trace
from .step import FamilySummary, LaunchProfile, StepProfile, profile_step

__all__ = [
    "FamilySummary",
    "LaunchCost",
    "LaunchProfile",
    "StepProfile",
    "chrome_trace",
    "format_profile",
    "launch_costs",
    "plot_roofline",
    "profile_step",
    "write_trace",
]
