"""The one compiled part: crypto._bin_products (C on GMP's mpn layer). Optional: without a C
compiler or GMP's headers (Debian: libgmp-dev) the package installs and crypto.bin_products
runs its gmpy2 loop instead, and says so (``crypto.bin_products.kernel()``)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("crypto._bin_products", ["crypto/_bin_products.c"],
                             libraries=["gmp"], extra_compile_args=["-O2"], optional=True)])
