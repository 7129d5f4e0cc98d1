"""Projectors: independent processes that fold the journal.

`base.py` is the contract every fold extends, `runner.py` the process loop
around it; each other module is one projector, named in the process
registry (contentsvc.processes.registry) that `contentsvc run`,
`contentsvc projector run NAME` and compose.yaml are built from.
"""
