"""Package layout that pyproject.toml cannot express on its own.

The Alembic scripts stay in the top-level `migrations/` folder (their source of truth);
the wheel ships them inside the package as `threadloom._migrations`, so an installed
`threadloom` finds them next to its code (see `threadloom.store.migrate`).
"""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages("src"), "threadloom._migrations", "threadloom._migrations.versions"],
    package_dir={"": "src", "threadloom._migrations": "migrations"},
)
