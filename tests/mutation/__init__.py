"""The mutation check (`python -m tests.mutation`): test tooling that plants mistakes in the library and
reports which ones the fast tests miss. See __main__.py."""
