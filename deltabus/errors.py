"""One error type for everything a user can fix, so the CLI prints it as one clear line."""


class DeltabusError(Exception):
    """A problem the user can fix: `str()` says what is wrong, `hint` says how to fix it."""

    def __init__(self, problem: str, hint: str = "") -> None:
        super().__init__(problem)
        self.problem = problem
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.problem}\n  fix: {self.hint}" if self.hint else self.problem


class ConfigError(DeltabusError):
    """Invalid settings or options."""


class StorageError(DeltabusError):
    """The lake cannot be reached or used: bucket, credentials, endpoint, not a Delta table."""
