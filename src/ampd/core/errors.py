"""Errors the project raises on purpose."""


class AmpdError(Exception):
    """Base of every error ``ampd`` raises on purpose."""


class InputError(AmpdError, ValueError):
    """Bad user input: a trace line, a model or GPU name, a deployment string,
    a configuration field. The message names the file, line or field."""
