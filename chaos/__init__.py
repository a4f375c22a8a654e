"""Jepsen-style fault injection on real node processes, and a checker (``chatsync chaos``).

``schedule`` (the seeded nemesis schedule, pure), ``history`` (what the run recorded),
``checker`` (counters over a history and the nodes' final states, pure), ``workers`` (clients
posting signed ops), ``sessions`` (clients reading event logs and histories), ``nodes`` (the
node processes and what faults do to them), ``nemesis`` (the schedule carried out),
``monitor`` (divergence samples), ``oracle`` (the simulator's oracle on the final op set),
``report`` (summary, JSON, plot), ``runner`` (one run), ``cli``. Sits beside ``bench``: it
composes node processes (``cluster``), the client and the simulator's oracle.
"""

from chaos.checker import COUNTERS, Expected, NodeState, Report, check
from chaos.history import History
from chaos.schedule import KINDS, Fault, ScheduleParams, make_schedule

__all__ = [
    "COUNTERS",
    "KINDS",
    "Expected",
    "Fault",
    "History",
    "NodeState",
    "Report",
    "ScheduleParams",
    "check",
    "make_schedule",
]
