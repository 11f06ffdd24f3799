"""python -m gotrain ARGS: runs the gotrain binary the wheel installed.

The binary sits in the environment's scripts directory (a venv's bin/), or
in the user scheme's for `pip install --user`; failing both, PATH's.
"""

import os
import shutil
import sys
import sysconfig


def _binary():
    schemes = [None]
    if hasattr(sysconfig, "get_preferred_scheme"):
        schemes.append(sysconfig.get_preferred_scheme("user"))
    else:
        schemes.append(os.name + "_user")
    for scheme in schemes:
        try:
            d = sysconfig.get_path("scripts", scheme) if scheme else sysconfig.get_path("scripts")
        except KeyError:
            continue
        p = os.path.join(d, "gotrain")
        if os.access(p, os.X_OK):
            return p
    return shutil.which("gotrain")


def main():
    exe = _binary()
    if exe is None:
        sys.stderr.write(
            "gotrain: the gotrain binary is not installed beside this Python package "
            "(looked in %s and on PATH); reinstall the wheel (pip install --force-reinstall gotrain) "
            "or put a gotrain binary on PATH\n" % sysconfig.get_path("scripts"))
        return 127
    os.execv(exe, [exe] + sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
