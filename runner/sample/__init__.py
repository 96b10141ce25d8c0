"""Built-in sample: small pypto-like, simpler-like and pypto-lib-like repositories.

Used by `make demo` and by the test suite; the packages build offline with setuptools inside the
test base image, and the example prints output in pypto-lib's format.
"""
