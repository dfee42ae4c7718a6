"""Loaded by scripts/schemathesis.sh through SCHEMATHESIS_HOOKS, before any case is generated.

CPython 3.11 before 3.11.8 (gh-106905) can raise "SystemError: AST constructor recursion depth
mismatch" from ast.parse when it runs deep in a stack, as hypothesis does when it describes a
lambda of a strategy by parsing the lambda's source file. Schemathesis then reports a runtime error
of its own for the operation, and no request is judged. The description is cosmetic: hypothesis
falls back to "lambda: <unknown>" when the source does not parse, so that error is turned into
the SyntaxError it already handles. Later Pythons are left alone.
"""

import ast
import sys

if sys.version_info < (3, 11, 8):
    _parse = ast.parse

    def _parse_without_the_depth_bug(source, *args, **kwargs):
        try:
            return _parse(source, *args, **kwargs)
        except SystemError as error:
            if "recursion depth mismatch" not in str(error):
                raise
            raise SyntaxError(str(error)) from error

    ast.parse = _parse_without_the_depth_bug
