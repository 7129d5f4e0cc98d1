"""The package list: every package under src/, plus the top-level folders (and any
packages inside them) that pyproject.toml's package-dir maps into the contentsvc namespace."""

from setuptools import find_packages, setup

MAPPED = ("projectors", "bench", "schema")

setup(packages=[
    *find_packages("src"),
    *(f"contentsvc.{folder}" for folder in MAPPED),
    *(f"contentsvc.{folder}.{sub}" for folder in MAPPED for sub in find_packages(folder)),
])
