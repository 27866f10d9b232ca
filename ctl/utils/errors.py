"""The one exception type for mistakes a user can fix.

A `UserError` carries a one-line message that names the problem and the fix.
`python -m ctl.run` prints it on stderr and exits with `EXIT_USER_ERROR`,
without a traceback. Everything else is a bug in ctl or in user code and keeps
its traceback.
"""

import re
import sys
from typing import Callable, List, NoReturn, Optional

EXIT_USER_ERROR = 2


class UserError(Exception):
    """A bad flag, gin binding, path, TF_CONFIG or checkpoint.

    Args:
        message: one line naming the problem and the fix.
    """

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


def exit_with_error(command: str, message: str) -> NoReturn:
    """Ends `python -m <command>` on a user's mistake: `<command>: error: <message>`, one line
    on stderr, exit status `EXIT_USER_ERROR`.

    Args:
        command: the module as the user ran it, e.g. `ctl.run`.
        message: the problem and its fix, one line.
    """
    print(f"{command}: error: {message}", file=sys.stderr)
    sys.exit(EXIT_USER_ERROR)


def flags_parser(command: str, flag_values) -> Callable[[List[str]], List[str]]:
    """absl's `app.run(..., flags_parser=...)` for `command`: a bad flag ends it as
    `exit_with_error` does, naming `--helpfull`.

    Args:
        command: the module as the user ran it, e.g. `ctl.report`.
        flag_values: absl's `flags.FLAGS`.
    """
    from absl import flags

    def parse(argv: List[str]) -> List[str]:
        try:
            return flag_values(argv)
        except flags.Error as error:
            exit_with_error(command, f"{error}. See --helpfull.")

    return parse


def require_choice(name: str, value, choices) -> None:
    """Raises `UserError` unless `value` is one of `choices` (the message lists them).

    Args:
        name: the argument's name, for the message.
        value: the value received.
        choices: the values allowed.
    """
    if value not in choices:
        raise UserError(f"Received {name}={value!r}. Expected one of: {', '.join(choices)}.")


def user_error_within(error: BaseException):
    """The `UserError` behind `error`, or None.

    A `UserError` raised while TensorFlow traces a function reaches the caller
    wrapped (AutoGraph re-raises it as a `StagingError` carrying its stack);
    the original is in the exception's context.

    Args:
        error: an exception raised while TensorFlow traced or ran a function.
    """
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, UserError):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def one_line(error: BaseException, limit: int = 400) -> str:
    """The telling part of an error's message, on one line, cut at a word (with "...").

    An error raised inside `tf.function` starts with "in user code:" and a
    stack; the cause is in the last "...Error: ..." line and the line after it.

    Args:
        error: any exception.
        limit: the most characters returned.
    """
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in str(error).splitlines()]
    lines = [line for line in lines if line]
    if not lines:
        return type(error).__name__
    if lines[0] == "in user code:":
        causes = [i for i, line in enumerate(lines) if re.match(r"^\w*(Error|Exception)\b.*:", line)]
        if causes:
            lines = lines[causes[-1]:causes[-1] + 2]
            lines[0] = lines[0].split(":", 1)[1].strip()
    text = " ".join(lines[:2])
    if len(text) <= limit:
        return text
    return text[:limit].rsplit(" ", 1)[0] + " ..."


def first_line(error: BaseException, limit: Optional[int] = 160) -> str:
    """The first line of `error`'s message (at most `limit` characters), or its type's
    name if it has none: what a one-line `UserError` quotes of an underlying error.

    Args:
        error: any exception.
        limit: the most characters returned (None: no limit).
    """
    text = str(error).strip()
    return text.splitlines()[0][:limit] if text else type(error).__name__
