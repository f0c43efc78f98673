"""DataError: the one exception for bad data input, with a one-line message naming the fix."""


class DataError(ValueError):
    """Something about the data, its files or its settings is wrong; the message says how to fix it.

    Entry points (train.py, scripts/) catch it and print `error: <message>` instead of a traceback,
    so the message must stand on its own: what is wrong, then what to set or do instead.
    """
