"""Other libraries' private attributes, one small module per library (issue 23.6).

The coordinator relies on a few attributes its libraries do not document. Each use goes
through a function here, named for what it does, and each module's `problems()` says what an
upgrade removed (tests/unit/test_compat.py fails on any, and also checks each behaviour).
"""
