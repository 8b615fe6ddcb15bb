"""Who holds a run while it runs, and whether that holder is gone.

A run being run is held by a lease its holder renews; a holder that dies stops renewing, and
the run can be taken once the lease lapses. Waiting out the lease after a crash (30 s by
default) is what a user resuming a killed run would meet first, so a holder on this machine is
also named precisely enough to see it gone at once: the machine's boot, the process-id
namespace, the process id and the process's start time (which tells a process from a later one
given the same id). A holder of another machine, or one this machine cannot read (no ``/proc``),
is known gone only by its lapsed lease.
"""

from __future__ import annotations

import functools
import os


@functools.cache
def _boot_and_namespace() -> str | None:
    """This machine's boot and this process's pid namespace, or ``None`` where they cannot be
    read."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as boot:
            booted = boot.read().strip()
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None
    return f"{booted}:{namespace}"


def _started(pid: int) -> str | None:
    """When process ``pid`` started, in clock ticks since boot; ``None`` for no such process."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[19]  # Field 22 of stat(5), counted after the command's closing parenthesis.


def this_process() -> str | None:
    """This process, as a holder on this machine is named; ``None`` where it cannot be."""
    machine = _boot_and_namespace()
    started = _started(os.getpid())
    if machine is None or started is None:
        return None
    return f"{machine}:{os.getpid()}:{started}"


def gone(process: str | None) -> bool:
    """Whether the holder named ``process`` (by :func:`this_process`, in whichever process held
    the run) is known to have ended: a process of this machine and namespace no longer running.
    ``False`` when it cannot be known here."""
    if process is None:
        return False
    machine = _boot_and_namespace()
    kept, _, rest = process.rpartition(":")
    machine_of, _, pid = kept.rpartition(":")
    if machine is None or machine_of != machine:
        return False
    try:
        return _started(int(pid)) != rest
    except ValueError:
        return False
