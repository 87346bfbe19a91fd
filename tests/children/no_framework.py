"""A runner whose framework is missing from the interpreter: it fails at import, before
runners.common can write a result, as a real runner in the wrong environment does."""

import tensorflow_that_is_not_installed  # noqa: F401
