"""The one exception type users see: a message that names the file and the fix."""


class BertraceError(Exception):
    """A user-facing error: bad input, missing file, mismatched hashes.

    Stage entry points catch it and print ``error: <message>`` without a traceback,
    then exit with status 2.
    """
