"""Reads of a model dir's state that do not wait for each other.

In an object store each read is a round trip (50 ms and more), and a run
reads a dozen small records at its start and its end. `at_once` runs
independent reads side by side, each on a thread of its own, and `ahead`
starts one before it is needed (while the run builds and traces) and hands its
result over when asked. On a file system both run the reads in the caller's
thread, as before: there a read costs microseconds. An error a read raises is
raised where its result is asked for, as if it had run there.
"""

import threading
from typing import Any, Callable, Dict, Optional

from ctl.model_dir.files import is_object_store


class Ahead:
    """One read, started now on a thread of its own (object stores) or run when asked.

    Args:
        path: the model dir (or a file in it): decides whether the read runs ahead.
        read: the read, a function of no arguments.
        name: the thread's name.
    """

    def __init__(self, path: str, read: Callable[[], Any], name: str = "ctl-read-ahead"):
        self._read = read
        self._result: Any = None
        self._error: Optional[BaseException] = None
        self._thread: Optional[threading.Thread] = None
        if is_object_store(path):
            self._thread = threading.Thread(target=self._run, name=name, daemon=True)
            self._thread.start()

    def _run(self) -> None:
        try:
            self._result = self._read()
        except BaseException as error:  # Raised in `result()`, on the caller's thread.
            self._error = error

    def result(self) -> Any:
        """The read's result (waiting for it), or the error it raised, raised here."""
        if self._thread is None:
            return self._read()
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._result


def at_once(path: str, reads: Dict[str, Callable[[], Any]]) -> Dict[str, Any]:
    """Runs `reads` side by side (object stores; one after the other on a file system).

    Args:
        path: the model dir (or a file in it): decides whether the reads run side by side.
        reads: name -> a read, a function of no arguments.

    Returns:
        name -> the read's result; the first error a read raised is raised.
    """
    started = {name: Ahead(path, read, name=f"ctl-read-{name}") for name, read in reads.items()}
    return {name: ahead.result() for name, ahead in started.items()}
