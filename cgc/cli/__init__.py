"""The ``cgc`` command line (click). See ``cgc.cli.main``."""
