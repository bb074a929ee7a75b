"""Package layout that pyproject.toml cannot express on its own.

The Alembic scripts stay in the top-level `migrations/` folder (their source of truth);
the wheel ships them inside the package as `threadloom._migrations`, so an installed
`threadloom` finds them next to its code (see `threadloom.store.migrate`).

Folders of data files inside the package (the dashboard's `static/`) are packages too, namespace ones: listed by
`find_namespace_packages`, their files named in pyproject.toml's package-data. A data folder missing from
`packages` is a setuptools warning on every install, and in a future setuptools an empty wheel folder.
"""

from setuptools import find_namespace_packages, setup

setup(
    packages=[
        *find_namespace_packages("src", include=["threadloom*"], exclude=["*.__pycache__"]),
        "threadloom._migrations",
        "threadloom._migrations.versions",
    ],
    package_dir={"": "src", "threadloom._migrations": "migrations"},
)
