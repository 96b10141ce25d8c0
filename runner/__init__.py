"""bisect-precision-docker: find the commit behind a numerical-precision regression in pypto."""

__version__ = "0.1.0"
