"""The package list: every package under src/, plus the top-level folders that
pyproject.toml's package-dir maps into the contentsvc namespace."""

from setuptools import find_packages, setup

setup(packages=[*find_packages("src"), "contentsvc.projectors", "contentsvc.bench", "contentsvc.schema"])
