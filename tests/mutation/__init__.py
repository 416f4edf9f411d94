"""Mutation testing (mutmut, configured in ``pyproject.toml``): ``survivors.py`` writes
``SURVIVORS.md``, every surviving mutant with the reason it cannot be detected.
"""
