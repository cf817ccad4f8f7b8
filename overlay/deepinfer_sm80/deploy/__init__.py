"""Topology files, validation and the launcher behind the ``deepinfer`` command.

Imports neither torch nor vLLM: it runs on any host.
"""
