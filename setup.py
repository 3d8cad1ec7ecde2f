"""The package's optional C kernel (mooncake_store/native/README.md); the rest of the build is
declared in pyproject.toml.  Without a C compiler and Python's headers the extension is skipped
and the package installs without it (copies then use numpy)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "mooncake_store._copyhash",
            sources=["mooncake_store/native/copyhash.c"],
            include_dirs=["mooncake_store/native"],
            depends=["mooncake_store/native/xxhash.h"],
            extra_compile_args=["-O3"],
            optional=True,
        )
    ]
)
