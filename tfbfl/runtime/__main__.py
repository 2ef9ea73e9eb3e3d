"""`python -m tfbfl.runtime`: checks the installation (`check.check_install`)."""

from tfbfl.runtime.check import check_install

if __name__ == "__main__":
  check_install()
