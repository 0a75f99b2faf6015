"""The role protocols of ``Tx`` (stepstone/store/base.py), one concern a module:
a consumer takes the role it uses; ``Tx`` is their union. A fake store need only
implement the roles its tests exercise (tests/fakes/memory.py)."""
