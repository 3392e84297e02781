"""Typed errors. Anything deriving from `UserError` is the user's to fix: the CLI prints its message as one
line and exits non-zero, without a traceback. Other exceptions are bugs and keep their traceback."""


class UserError(Exception):
    """A mistake in input, configuration or environment that the user can fix."""


class ConfigError(UserError):
    """A YAML file or a field in it is malformed: the message names file, key and what was expected."""


class ModelNotFoundError(UserError):
    """A model spec that resolves to nothing loadable."""


class DataError(UserError):
    """A data file or split that is missing, empty or lacks a required field."""


class PromptTooLongError(UserError):
    """A rendered prompt does not fit the model's context window."""


class UnsupportedError(UserError):
    """A requested feature that this environment or model cannot provide (e.g. 4-bit without CUDA)."""


class StorageError(UserError):
    """The Optuna storage cannot be opened, or was lost during a run (trials left running are failed and
    re-run on --resume)."""


class CacheError(UserError):
    """The SQLite result cache is unreadable or corrupt; it only holds cached scores, so deleting it is safe."""


class ModelCacheError(UserError):
    """The model cache ($PROMPTOPT_CACHE) cannot take a de-quantized model: full or unwritable. The message names
    the folder and the space the model needs; nothing half-written is left in it."""
