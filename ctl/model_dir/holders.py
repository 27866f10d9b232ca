"""Who holds a claim: the record a holder writes, and how another process reads it
(`describe`, `role_of`) and tells whether its pid is still alive (`alive`, `pids_comparable`).
Shared by `ctl.model_dir.file_lock` and `ctl.model_dir.lease`.
"""

import datetime
import json
import os
import socket
import time
import uuid
from typing import Any, Dict, Optional

# Told apart from a former process of the same pid (its record, left by a kill, is stale).
PROCESS = uuid.uuid4().hex


def boot_id() -> Optional[str]:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip() or None
    except OSError:
        return None


def pid_namespace() -> Optional[str]:
    try:
        return os.readlink("/proc/self/ns/pid")  # e.g. "pid:[4026531836]"
    except OSError:
        return None


def holder_record(role: str, token: Optional[str] = None) -> Dict[str, Any]:
    """The record a claim's holder writes: who it is (role, pid, host, boot id, PID namespace,
    process nonce), its token, and when.

    Args:
        role: what the holder is.
        token: the lease's token (None: a file lock's record).
    """
    return {"role": role, "pid": os.getpid(), "host": socket.gethostname(),
            "boot_id": boot_id(), "pid_namespace": pid_namespace(), "process": PROCESS,
            "token": token, "renewed": time.time(),
            "since": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}


def pids_comparable(record: Dict[str, Any]) -> bool:
    """Whether `record`'s pid names a process this one can see: the same host, the same boot
    and the same PID namespace. Two containers of one pod share the host name, not the PIDs.

    Args:
        record: a holder's record.
    """
    here = (socket.gethostname(), boot_id(), pid_namespace())
    return None not in here[1:] and (record.get("host"), record.get("boot_id"),
                                     record.get("pid_namespace")) == here


def describe(record: Any, path: str) -> str:
    """The holder of `record` in words, for a message (`pid P on host H since T`).

    Args:
        record: a holder's record (or what was read instead of one).
        path: where it was read, named when the holder is unknown.
    """
    if isinstance(record, dict) and "unreadable" in record:
        return f"holder unknown: {path} could not be read ({record['unreadable']})"
    try:
        return f"pid {record['pid']} on host {record['host']} since {record['since']}"
    except (KeyError, TypeError):
        return f"holder unknown, see {path}"


def role_of(record: Any) -> str:
    """The role a holder's record names ("another process" when it names none).

    Args:
        record: a holder's record.
    """
    role = record.get("role") if isinstance(record, dict) else None
    return role if isinstance(role, str) else "another process"


def record_line(role: str) -> bytes:
    """This process's holder record as one JSON line (a file lock's contents).

    Args:
        role: what the holder is.
    """
    return (json.dumps(holder_record(role)) + "\n").encode()


def alive(pid: Any) -> bool:
    """Whether process `pid` of this host is alive (never this very process: a former life of its PID).

    Args:
        pid: a process id from a holder's record.
    """
    if not isinstance(pid, int) or pid == os.getpid():
        return False  # This process is not the holder it recorded: a former life of this PID.
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
