"""The one exception type for mistakes a user can fix.

A `UserError` carries a one-line message that names the problem and the fix.
`python -m ctl.run` prints it on stderr and exits with `EXIT_USER_ERROR`,
without a traceback. Everything else is a bug in ctl or in user code and keeps
its traceback.
"""

from typing import Optional

EXIT_USER_ERROR = 2


class UserError(Exception):
    """A bad flag, gin binding, path, TF_CONFIG or checkpoint."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


def require_choice(name: str, value, choices) -> None:
    """Raises `UserError` unless `value` is one of `choices` (the message lists them)."""
    if value not in choices:
        raise UserError(f"Received {name}={value!r}. Expected one of: {', '.join(choices)}.")


def user_error_within(error: BaseException):
    """The `UserError` behind `error`, or None.

    A `UserError` raised while TensorFlow traces a function reaches the caller
    wrapped (AutoGraph re-raises it as a `StagingError` carrying its stack);
    the original is in the exception's context.
    """
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, UserError):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def first_line(error: BaseException, limit: Optional[int] = 160) -> str:
    """The first line of `error`'s message (at most `limit` characters), or its type's
    name if it has none: what a one-line `UserError` quotes of an underlying error."""
    text = str(error).strip()
    return text.splitlines()[0][:limit] if text else type(error).__name__
